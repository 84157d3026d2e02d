//! The correctness generator: random schemas and rows on every pair of live engines,
//! a random mutation plan whose ground truth is known by construction, and real agents
//! over mutual TLS that must report exactly that truth on every path, strategy and
//! dataset form. A failing case is shrunk to a minimal one and printed as the two
//! sides' SQL, the agents' datasets and the spec, ready to paste into a test.
//!
//! `tests/tests/generated.rs` runs a fixed seed set in CI; `tally-gen --long DURATION`
//! (src/bin/tally-gen.rs) hunts with fresh seeds for as long as it is given.

pub mod case;
pub mod fidelity;
pub mod json;
pub mod rng;
pub mod run;
pub mod values;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use case::{Case, KeyShape, Mutation};
use rng::Rng;
use run::{Failure, Form, GRANULARITIES, Hashing, RunConfig, Strategy};
use values::{Class, Engine, V};

/// Runs the generator would make but holds back while the failure class they hit is
/// open, by the class's name; the coverage report counts them.
///
/// G1 (found when Spark joined the generator): Spark's `DESCRIBE QUERY` names a
/// `CHAR(n)` column `string` while its values still read padded to n, so a `query:`
/// dataset compares the padding as data where no side is described as `CHAR(n)` (a
/// false difference against the same text unpadded; `''` is no longer empty for
/// `empty_string_is_null`).
pub fn held(case: &Case, c: &RunConfig) -> Option<&'static str> {
    let spark_char_query = c.form == Form::Query
        && case.compared_columns().any(|col| {
            case.columns[col].class == Class::CharText
                && (0..2).any(|s| [case.source, case.target][s] == Engine::Spark && case.columns[col].alt[s])
                && !(0..2).any(|s| fidelity::described_fixed(case, col, s, c.form))
        });
    spark_char_query.then_some("G1 spark query char(n)")
}

/// A run Tally must refuse, by design: (the error code, the column it must name).
/// Text against a UUID on the other side is schema drift (docs/engines.md): MariaDB's
/// protocol describes a query's `UUID` column as `CHAR(36)` text, and Spark keeps a
/// UUID as STRING.
///
/// Text holding JSON (a MariaDB query's JSON, Spark's STRING) against JSON on the other
/// side, where the text's dataset reads '' as NULL (`empty_string_is_null`): that rule
/// holds for text compared as text only, so the run is refused naming the column
/// (docs/canonical-form.md).
///
/// An integer keyed against a decimal under strategy quantile or time: quantile cuts
/// cannot order its decimal text, so the run is refused naming the key column before
/// any scan (after the checks above, which resolve makes first).
pub fn refusal(case: &Case, c: &RunConfig) -> Option<(&'static str, String)> {
    let key = (case.key_shape == KeyShape::IntDec
        && matches!(c.strategy, Strategy::Quantile | Strategy::Time(_)))
    .then(|| ("config", case.columns[0].name.clone()));
    let classes = |col: usize| [0, 1].map(|s| fidelity::described(case, col, s, c.form));
    let across = |col: usize, a: &str| {
        let k = classes(col);
        (k[0] != k[1] && k.contains(&a) && k.contains(&"text")).then(|| usize::from(k[1] == "text"))
    };
    let name = |col: usize| case.columns[col].name.clone();
    let drift = case
        .compared_columns()
        .find(|&col| across(col, "uuid").is_some())
        .map(|col| ("schema_drift", name(col)));
    let json = case
        .compared_columns()
        .find(|&col| across(col, "json").is_some_and(|text_side| case.empty_is_null[text_side]))
        .map(|col| ("no_canonical_form", name(col)));
    // schema drift is reported before columns without a canonical form
    drift.or(json).or(key)
}

/// What a hunt covered: how many runs exercised each dimension.
#[derive(Debug, Default)]
pub struct Coverage {
    pub dims: BTreeMap<&'static str, BTreeMap<String, usize>>,
    pub runs: usize,
    pub cases: usize,
}

impl Coverage {
    fn add(&mut self, dim: &'static str, what: impl Into<String>) {
        *self.dims.entry(dim).or_default().entry(what.into()).or_default() += 1;
    }

    fn case(&mut self, case: &Case, configs: &[RunConfig], held_runs: &[(RunConfig, &'static str)]) {
        self.cases += 1;
        for c in configs {
            self.runs += 1;
            self.add("pair", format!("{}->{}", case.source.name(), case.target.name()));
            self.add(
                "path",
                match c.hashing {
                    Hashing::Auto => "auto",
                    Hashing::Pushdown => "pushdown",
                },
            );
            self.add("strategy", c.strategy.label());
            self.add(
                "form",
                match c.form {
                    Form::Table => "table",
                    Form::Query => "query",
                },
            );
            for col in &case.columns[case.nkeys..] {
                self.add("class", col.class.label());
                if col.class == Class::CharText {
                    let pads = match col.alt {
                        [true, true] => "both sides",
                        [true, false] => "source only",
                        _ => "target only",
                    };
                    self.add("char(n)", pads);
                }
            }
            self.add("key", case.key_shape.label());
            for m in &case.mutations {
                self.add("mutation", m.label());
            }
            if !case.exclude.is_empty() {
                self.add("option", "exclude");
            }
            if case.zones != ["UTC", "UTC"] {
                self.add("option", "time_zone");
            }
            if case.empty_is_null.contains(&true) {
                self.add("option", "empty_string_is_null");
            }
            for &(col, n) in &case.overrides {
                self.add("option", "overrides");
                let class = case.columns[col].class;
                let what = if class.is_time() { "precision" } else { "scale" };
                self.add("override", format!("{} {what} {n}", class.label()));
            }
            if let Some(w) = &case.window {
                self.add("option", "window");
                let col = &case.columns[w.col];
                let key = if w.col < case.nkeys { " key" } else { "" };
                self.add("window", format!("{}{key}", col.class.label()));
            }
            if refusal(case, c).is_none() {
                let f = fidelity::expected(case, c);
                if f.is_empty() {
                    self.add("fidelity", "full");
                }
                for code in f.values().flatten().collect::<std::collections::BTreeSet<_>>() {
                    self.add("fidelity", *code);
                }
            }
            let truth = match refusal(case, c) {
                Some(_) => "refusal",
                None if case.truth().is_match() => "match",
                None => "differ",
            };
            self.add("truth", truth);
        }
        for (_, why) in held_runs {
            self.add("held", *why);
        }
    }

    /// One line per dimension: every value with its run count.
    pub fn report(&self) -> String {
        let mut s = format!("{} cases, {} runs\n", self.cases, self.runs);
        for (dim, m) in &self.dims {
            let items: Vec<String> = m.iter().map(|(k, n)| format!("{k} {n}")).collect();
            s.push_str(&format!("  {dim:9} {}\n", items.join(", ")));
        }
        s
    }
}

/// A case's run configurations: each path with each dataset form, each with a
/// strategy drawn from those that apply.
pub fn configs(case: &Case, r: &mut Rng) -> Vec<RunConfig> {
    let pushes = case.source.pushes_down() || case.target.pushes_down();
    let mut out = Vec::new();
    for hashing in [Hashing::Auto, Hashing::Pushdown] {
        if hashing == Hashing::Pushdown && !pushes {
            continue;
        }
        for form in [Form::Table, Form::Query] {
            let mut strategies = vec![Strategy::Quantile, Strategy::Hash];
            // keys quantile cuts cannot order: auto must bisect them by hash
            if case.key_shape == KeyShape::IntDec {
                strategies.push(Strategy::Auto);
            }
            if case.time_column().is_some() {
                strategies.push(Strategy::Time(
                    GRANULARITIES[r.below(GRANULARITIES.len() as u64) as usize],
                ));
            }
            out.push(RunConfig {
                hashing,
                strategy: *r.pick(&strategies),
                form,
                factor: *r.pick(&[2, 4, 16]),
                threshold: *r.pick(&[1, 4, 16, 64]),
            });
        }
    }
    out
}

/// Options of a hunt.
#[derive(Debug, Clone)]
pub struct Hunt {
    pub seed: u64,
    /// cases per ordered engine pair in each round
    pub cases_per_pair: usize,
    /// rounds to run; with `duration`, as many as fit
    pub rounds: usize,
    pub duration: Option<Duration>,
    pub workers: usize,
    /// shrink at most this many failures (the first of each kind and pair)
    pub shrink: usize,
    pub engines: Vec<Engine>,
    /// cases per ordered pair with a Spark side in each round (Spark takes a second or
    /// more per statement)
    pub spark_cases_per_pair: usize,
}

impl Default for Hunt {
    fn default() -> Hunt {
        Hunt {
            seed: 1,
            cases_per_pair: 2,
            rounds: 1,
            duration: None,
            workers: 2,
            shrink: 3,
            engines: Engine::live(),
            spark_cases_per_pair: 1,
        }
    }
}

/// What a hunt found.
#[derive(Debug, Default)]
pub struct Findings {
    pub coverage: Coverage,
    pub failures: Vec<(Case, Failure)>,
    /// each shrunk failure printed as a reproduction
    pub reproductions: Vec<String>,
}

fn mix(a: u64, b: u64) -> u64 {
    let mut r = Rng::new(a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    r.next_u64()
}

/// A case, the runs it gets, and the runs held back (with the open class they would hit).
pub type Planned = (Case, Vec<RunConfig>, Vec<(RunConfig, &'static str)>);

/// The cases of one round: `cases_per_pair` for every ordered pair of engines
/// (`spark_cases_per_pair` for a pair with a Spark side).
pub fn round(h: &Hunt, round: usize) -> Vec<Planned> {
    let mut out = Vec::new();
    for (pi, s) in h.engines.iter().enumerate() {
        for (ti, t) in h.engines.iter().enumerate() {
            let n = if [*s, *t].contains(&Engine::Spark) {
                h.spark_cases_per_pair
            } else {
                h.cases_per_pair
            };
            for j in 0..n {
                let seed = mix(
                    h.seed,
                    ((round as u64) << 40) | ((pi as u64) << 20) | ((ti as u64) << 10) | j as u64,
                );
                let case = Case::generate(seed, *s, *t);
                let mut r = Rng::new(seed ^ 0x5eed);
                let (run, hold): (Vec<_>, Vec<_>) = configs(&case, &mut r)
                    .into_iter()
                    .map(|c| (c, held(&case, &c)))
                    .partition(|(_, h)| h.is_none());
                let run = run.into_iter().map(|(c, _)| c).collect();
                let hold = hold.into_iter().map(|(c, h)| (c, h.unwrap())).collect();
                out.push((case, run, hold));
            }
        }
    }
    out
}

/// Runs rounds of generated cases until the rounds or the time are used up; shrinks
/// and prints the first failures.
pub fn hunt(h: &Hunt) -> Findings {
    let start = Instant::now();
    let mut f = Findings::default();
    let mut n = 0;
    loop {
        let done = match h.duration {
            Some(d) => start.elapsed() >= d,
            None => n >= h.rounds,
        };
        if done {
            break;
        }
        let cases = round(h, n);
        for (case, run, hold) in &cases {
            f.coverage.case(case, run, hold);
        }
        let batch: Vec<(usize, &Case, Vec<RunConfig>)> = cases
            .iter()
            .enumerate()
            .map(|(i, (c, run, _))| (i, c, run.clone()))
            .collect();
        let failures = run::run_batch(&format!("gen_{}_{n}", h.seed), &batch, h.workers);
        for fl in failures {
            eprintln!(
                "FAIL round {n} case {} seed {} {}->{} [{}] {}: {}",
                fl.case,
                cases[fl.case].0.seed,
                cases[fl.case].0.source.name(),
                cases[fl.case].0.target.name(),
                fl.config.label(),
                fl.class,
                fl.detail
            );
            f.failures.push((cases[fl.case].0.clone(), fl));
        }
        n += 1;
        if h.duration.is_some() {
            eprintln!(
                "round {n}: {} runs so far, {} failures",
                f.coverage.runs,
                f.failures.len()
            );
        }
    }
    // shrink the first failure of each (pair, kind)
    let mut seen = std::collections::BTreeSet::new();
    let firsts: Vec<(Case, Failure)> = f
        .failures
        .iter()
        .filter(|(c, fl)| seen.insert((c.source, c.target, fl.class)))
        .take(h.shrink)
        .cloned()
        .collect();
    for (case, fl) in firsts {
        let small = shrink(&case, &fl.config);
        f.reproductions.push(reproduction(&small, &fl.config));
    }
    f
}

/// Whether a case still fails under one configuration (a fresh deployment of its own).
fn fails(case: &Case, c: &RunConfig) -> Option<Failure> {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    run::run_batch(
        &format!("shrink_{}_{n}", std::process::id()),
        &[(0, case, vec![*c])],
        1,
    )
    .into_iter()
    .next()
}

/// The smallest case found that still fails: fewer mutations, rows and columns, each
/// removal kept only where the run still fails.
pub fn shrink(case: &Case, c: &RunConfig) -> Case {
    let budget = Instant::now() + Duration::from_secs(240);
    let mut best = case.clone();
    let Some(first) = fails(&best, c) else {
        eprintln!("shrink: the failure did not repeat (a flaky run?)");
        return best;
    };
    let class = first.class;
    let still =
        |cand: &Case| -> bool { Instant::now() < budget && fails(cand, c).is_some_and(|f| f.class == class) };
    // mutations, one at a time
    let mut i = 0;
    while i < best.mutations.len() {
        let mut cand = best.clone();
        cand.mutations.remove(i);
        if still(&cand) {
            best = cand;
        } else {
            i += 1;
        }
    }
    // rows not named by a mutation, in halves, then one at a time
    let mut chunk = best.base.len().div_ceil(2).max(1);
    while chunk >= 1 && !best.base.is_empty() {
        let mut at = 0;
        while at < best.base.len() {
            let mut cand = best.clone();
            let end = (at + chunk).min(cand.base.len());
            let named: Vec<Vec<V>> = cand.mutations.iter().filter_map(mutation_key).collect();
            let before = cand.base.len();
            let mut idx = 0;
            cand.base.retain(|(s, _)| {
                let keep = idx < at || idx >= end || named.contains(&case::key_of(s, cand.nkeys));
                idx += 1;
                keep
            });
            if cand.base.len() < before && still(&cand) {
                best = cand;
            } else {
                at += chunk;
            }
        }
        if chunk == 1 {
            break;
        }
        chunk /= 2;
    }
    // columns (never a key, the strategy's time column or the last compared one)
    let mut col = best.columns.len();
    while col > best.nkeys {
        col -= 1;
        if col >= best.columns.len() || best.columns.len() - best.nkeys <= 1 {
            continue;
        }
        if matches!(c.strategy, Strategy::Time(_))
            && best.time_column().map(|t| &t.name) == Some(&best.columns[col].name)
        {
            continue;
        }
        if best.window.as_ref().is_some_and(|w| w.col == col) {
            continue;
        }
        let cand = without_column(&best, col);
        if still(&cand) {
            best = cand;
        }
    }
    best
}

fn mutation_key(m: &Mutation) -> Option<Vec<V>> {
    match m {
        Mutation::Change { key, .. } | Mutation::Delete { key, .. } | Mutation::Duplicate { key, .. } => {
            Some(key.clone())
        }
        Mutation::Rekey { key, .. } => Some(key.clone()),
        Mutation::Insert { .. } => None,
    }
}

fn without_column(case: &Case, col: usize) -> Case {
    let mut c = case.clone();
    c.columns.remove(col);
    for (s, t) in &mut c.base {
        s.remove(col);
        t.remove(col);
    }
    let shift = |i: usize| if i > col { i - 1 } else { i };
    if let Some(w) = &mut c.window {
        w.col = shift(w.col);
    }
    c.overrides = c
        .overrides
        .iter()
        .filter(|(o, _)| *o != col)
        .map(|&(o, n)| (shift(o), n))
        .collect();
    c.exclude = c
        .exclude
        .iter()
        .filter(|&&e| e != col)
        .map(|&e| shift(e))
        .collect();
    c.mutations = c
        .mutations
        .into_iter()
        .filter_map(|m| match m {
            Mutation::Change { col: mc, .. } if mc == col => None,
            Mutation::Change {
                key,
                col: mc,
                to,
                why,
            } => Some(Mutation::Change {
                key,
                col: shift(mc),
                to,
                why,
            }),
            Mutation::Insert { mut row } => {
                row.remove(col);
                Some(Mutation::Insert { row })
            }
            Mutation::Duplicate { key, change } => Some(Mutation::Duplicate {
                key,
                change: change.filter(|(mc, _)| *mc != col).map(|(mc, v)| (shift(mc), v)),
            }),
            m => Some(m),
        })
        .collect();
    c
}

/// A failing case as the two sides' SQL, the datasets and the spec, with its truth.
pub fn reproduction(case: &Case, c: &RunConfig) -> String {
    let mut s = format!(
        "== reproduction: seed {} {} -> {} [{}]\n",
        case.seed,
        case.source.name(),
        case.target.name(),
        c.label()
    );
    for side in 0..2 {
        let e = [case.source, case.target][side];
        s.push_str(&format!(
            "-- {} ({}):\n{}",
            ["source", "target"][side],
            e.name(),
            run::side_sql(case, 0, side, "")
        ));
    }
    let key: Vec<&str> = case.columns[..case.nkeys]
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    s.push_str(&format!(
        "-- datasets: key [{}], hashing {:?}, form {:?} (query: SELECT every column FROM the table), time_zone {:?}, empty_string_is_null {:?}\n",
        key.join(", "),
        c.hashing,
        c.form,
        case.zones,
        case.empty_is_null
    ));
    s.push_str(&format!("-- spec:\n{}", run::spec(case, 0, c)));
    let t = case.truth();
    s.push_str(&format!(
        "-- truth: differences {:?}; duplicates (source, target) {:?}\n",
        t.diffs, t.duplicates
    ));
    s.push_str(&format!(
        "-- mutations: {:?}\n",
        case.mutations.iter().map(Mutation::label).collect::<Vec<_>>()
    ));
    s
}

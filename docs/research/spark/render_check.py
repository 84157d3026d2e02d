"""Spark SQL (ANSI on, session UTC) renderings for Tally's canonical form, verified live."""
import sys, warnings, logging
warnings.filterwarnings("ignore")
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(f"sc://127.0.0.1:{sys.argv[1]}").getOrCreate()
logging.getLogger("pyspark").setLevel(logging.CRITICAL)
def q(label, sql):
    try:
        rows = spark.sql(sql).collect()
        print(f"OK  {label}: " + " | ".join(repr(tuple(r)) if len(r) > 1 else repr(r[0]) for r in rows))
    except Exception as e:
        print(f"ERR {label}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
def V(vals, typ):  # a one-column inline table of typed values
    return "(SELECT CAST(v AS %s) AS x FROM VALUES %s AS t(v))" % (typ, ", ".join(f"({v})" for v in vals))

print("== integers")
q("int", f"SELECT CAST(x AS STRING) FROM {V(['-9223372036854775808','9223372036854775807','0','-42'], 'BIGINT')}")
q("tinyint", f"SELECT CAST(x AS STRING) FROM {V(['-128','127'], 'TINYINT')}")

print("== decimals: cast to string")
q("dec(38,10) small", f"SELECT CAST(x AS STRING) FROM {V(['0.0000000001','-0.0000000001','0','1250.5','-0.01'], 'DECIMAL(38,10)')}")
q("dec(38,0) max", f"SELECT CAST(x AS STRING) FROM {V(['99999999999999999999999999999999999999','-99999999999999999999999999999999999999'], 'DECIMAL(38,0)')}")
q("dec(38,38)", f"SELECT CAST(x AS STRING) FROM {V(['0.00000000000000000000000000000000000001','-0.99999999999999999999999999999999999999'], 'DECIMAL(38,38)')}")
q("dec scale up by cast (38,0)->(38,2) overflows?", f"SELECT CAST(CAST(x AS DECIMAL(38,2)) AS STRING) FROM {V(['99999999999999999999999999999999999999'], 'DECIMAL(38,0)')}")
print("== decimal at resolved scale s >= column scale k: text padded with zeros (no cast, no overflow)")
q("(38,0) at s=2", f"SELECT CASE WHEN x = 0 THEN '0.00' ELSE CAST(x AS STRING) || '.00' END FROM {V(['99999999999999999999999999999999999999','-5','0'], 'DECIMAL(38,0)')}")
q("(10,1) at s=3", f"SELECT CASE WHEN x = 0 THEN '0.000' ELSE CAST(x AS STRING) || '00' END FROM {V(['1250.5','-0.1','0.0'], 'DECIMAL(10,1)')}")
print("== decimal at s < column scale: round() is HALF_UP (away from zero)")
q("round (10,3) to 2", f"SELECT CASE WHEN round(x, 2) = 0 THEN '0.00' ELSE CAST(round(x, 2) AS STRING) END, typeof(round(x,2)) FROM {V(['1.005','-1.005','-0.001','99.995','0.004'], 'DECIMAL(10,3)')}")
q("round (38,38) to 0", f"SELECT CAST(round(x, 0) AS STRING), typeof(round(x,0)) FROM {V(['0.5','-0.5'], 'DECIMAL(38,38)')}")
q("round (38,10) max-ish to 2", f"SELECT CAST(round(x, 2) AS STRING) FROM {V(['9999999999999999999999999999.9999999999'], 'DECIMAL(38,10)')}")
print("== decimal exact (undeclared scale on the other side)")
EX = "CASE WHEN x = 0 THEN '0' WHEN instr(CAST(x AS STRING), '.') > 0 THEN TRIM(TRAILING '.' FROM TRIM(TRAILING '0' FROM CAST(x AS STRING))) ELSE CAST(x AS STRING) END"
q("exact", f"SELECT {EX} FROM {V(['10.500','10.000','-0.000','1500','-0.010','0.001'], 'DECIMAL(10,3)')}")
q("exact (5,0)", f"SELECT {EX} FROM {V(['100','0','-10'], 'DECIMAL(5,0)')}")

print("== floats: CAST(double AS STRING) is Java's Double.toString (JDK of the server)")
q("double", "SELECT CAST(x AS STRING) FROM (SELECT explode(array(0.1D, 1e20D, 1e-7D, 100D, -0.0D, 0.0D, 5.834e21D, 2e23D, 1e23D, 4.35D, 1.0E-5D, 1e7D, 1234567.0D, 9007199254740993D)) AS x)")
q("double specials", "SELECT CAST(x AS STRING) FROM (SELECT explode(array(CAST('NaN' AS DOUBLE), CAST('Infinity' AS DOUBLE), CAST('-Infinity' AS DOUBLE))) AS x)")
q("float widened", "SELECT CAST(CAST(x AS DOUBLE) AS STRING), CAST(x AS STRING) FROM (SELECT CAST(1234.567 AS FLOAT) AS x)")
q("-0.0 = 0.0 ? and NaN = NaN ?", "SELECT -0.0D = 0.0D, CAST('NaN' AS DOUBLE) = CAST('NaN' AS DOUBLE)")
q("double -> decimal(38,6)", "SELECT CAST(CAST(x AS DECIMAL(38,6)) AS STRING) FROM (SELECT explode(array(0.1D, 1e20D, 2.5e-7D, -0.0D)) AS x)")
q("NaN -> decimal ANSI", "SELECT CAST(CAST('NaN' AS DOUBLE) AS DECIMAL(38,6))")

print("== boolean / text / binary")
q("boolean", "SELECT CASE WHEN x THEN '1' WHEN NOT x THEN '0' END FROM (SELECT explode(array(true, false, NULL)) AS x)")
q("octet_length", "SELECT octet_length('héllo'), length('héllo'), octet_length('😀'), octet_length('')")
q("char(6) read", "SELECT '[' || x || ']', '[' || TRIM(TRAILING ' ' FROM x) || ']' FROM (SELECT CAST('abc' AS CHAR(6)) AS x)")
spark.sql("DROP TABLE IF EXISTS ct"); spark.sql("CREATE TABLE ct (c CHAR(6), v VARCHAR(6), s STRING) USING parquet")
spark.sql("INSERT INTO ct VALUES ('abc', 'abc  ', 'abc\t ')")
q("char(6) col", "SELECT '[' || c || ']', octet_length(c), '[' || TRIM(TRAILING ' ' FROM c) || ']', '[' || v || ']', '[' || TRIM(TRAILING ' ' FROM s) || ']' FROM ct")
q("describe ct", "DESCRIBE TABLE ct")
q("binary", "SELECT lower(hex(X'DEADBEEF00')), lower(hex(encode('héllo', 'UTF-8'))), lower(hex(CAST('héllo' AS BINARY))), lower(hex(X''))")
q("bytewise text order", "SELECT 'é' > 'z', 'Z' < 'a', 'abc ' > 'abc', collation('x')")
q("uuid text", "SELECT lower(CAST(uuid() AS STRING)) IS NOT NULL")

print("== dates")
q("date", "SELECT CAST(DATE'2024-03-15' AS STRING), CAST(DATE'0001-01-01' AS STRING), CAST(DATE'9999-12-31' AS STRING)")
q("date outside 1..9999 (make_date)", "SELECT CAST(make_date(10000,1,1) AS STRING)")
q("date outside via date_add", "SELECT CAST(date_add(DATE'9999-12-31', 1) AS STRING), CAST(date_add(DATE'0001-01-01', -1) AS STRING), CAST(date_add(DATE'0001-01-01', -367) AS STRING), CAST(date_add(DATE'0001-01-01', -366-365) AS STRING)")
q("date literal +10000", "SELECT CAST(DATE'+10000-01-01' AS STRING)")

print("== timestamps (session UTC)")
TS = lambda x, p, z: (f"CAST(CAST({x} AS DATE) AS STRING) || 'T' || date_format({x}, 'HH:mm:ss')"
                      + ("" if p == 0 else f" || '.' || substr(date_format({x}, 'SSSSSS'), 1, {p})") + (" || 'Z'" if z else ""))
q("ltz p=6", f"SELECT {TS('x', 6, True)}, CAST(x AS STRING) FROM (SELECT explode(array(TIMESTAMP'2024-03-15 14:30:00.999999', TIMESTAMP'2024-03-15 14:30:00', TIMESTAMP'1969-12-31 23:59:59.000001', TIMESTAMP'0001-01-01 00:00:00', TIMESTAMP'9999-12-31 23:59:59.999999')) AS x)")
q("ltz p=3 cut, p=0", f"SELECT {TS('x', 3, True)}, {TS('x', 0, True)} FROM (SELECT TIMESTAMP'2024-03-15 14:30:00.999999' AS x)")
q("ltz with offset literal", f"SELECT {TS('x', 6, True)} FROM (SELECT TIMESTAMP'2024-03-15 16:30:00.1+02:00' AS x)")
q("ntz p=6", f"SELECT {TS('x', 6, False)}, typeof(x) FROM (SELECT explode(array(TIMESTAMP_NTZ'2024-03-15 14:30:00.123456', TIMESTAMP_NTZ'1969-12-31 23:59:59.5', TIMESTAMP_NTZ'0001-01-01 00:00:00')) AS x)")
q("ntz read in +02:00 as timestamptz", f"SELECT {TS('u', 6, True)} FROM (SELECT convert_timezone('+02:00', 'UTC', TIMESTAMP_NTZ'2024-03-15 16:30:00.1') AS u)")
q("ntz read in +02:00 near 0001", f"SELECT {TS('u', 6, True)} FROM (SELECT convert_timezone('+02:00', 'UTC', TIMESTAMP_NTZ'0001-01-01 00:30:00') AS u)")
q("ts year 10000", f"SELECT {TS('x', 6, True)}, CAST(x AS STRING) FROM (SELECT TIMESTAMP'9999-12-31 23:59:59.999999' + INTERVAL 1 DAY AS x)")
q("arrow path types", "SELECT TIMESTAMP'2024-01-01 00:00:00' AS a, TIMESTAMP_NTZ'2024-01-01 00:00:00' AS b")
q("time type", "SELECT CAST(TIME'12:34:56.123456' AS STRING), typeof(TIME'12:34:56')")

print("== row string, hashes (the doc's worked example: 2:426:héllo~7:1250.50, sha256_64 0x08845da811beac8b, md5_48 78806769262314)")
F = lambda c: f"COALESCE(CAST(octet_length({c}) AS STRING) || ':' || {c}, '~')"
ROW = "(" + " || ".join([F("CAST(a AS STRING)"), F("b"), F("c"), F("CASE WHEN d = 0 THEN '0.00' ELSE CAST(d AS STRING) || '0' END")]) + ")"
SRC = "(SELECT 42L AS a, 'héllo' AS b, CAST(NULL AS STRING) AS c, CAST(1250.5 AS DECIMAL(10,1)) AS d)"
q("row string", f"SELECT {ROW} FROM {SRC}")
q("sha2 hex prefix", f"SELECT substr(sha2({ROW}, 256), 1, 16) FROM {SRC}")
q("sha256_64 signed via conv(...,16,-10)", f"SELECT CAST(conv(substr(sha2({ROW}, 256), 1, 16), 16, -10) AS BIGINT) FROM {SRC}")
q("md5_48", f"SELECT CAST(conv(substr(md5({ROW}), 1, 12), 16, 10) AS BIGINT) - 140737488355328 FROM {SRC}")
q("conv unsigned of high-bit hash", "SELECT conv('ffffffffffffffff', 16, 10), conv('ffffffffffffffff', 16, -10), conv('8000000000000000', 16, -10)")
q("CAST(unsigned text AS BIGINT) under ANSI", "SELECT CAST(conv('ffffffffffffffff', 16, 10) AS BIGINT)")
q("conv overflow 17 hex digits under ANSI", "SELECT conv('1ffffffffffffffff', 16, 10)")
q("bucket hash (top 60 bits)", "SELECT CAST(conv(substr(sha2('2:42', 256), 1, 15), 16, 10) AS BIGINT), substr(sha2('2:42',256),1,15)")
K = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
q("sealed: sha2(unhex(k) || encode(r))", f"SELECT substr(sha2(concat(unhex('{K}'), encode('2:42', 'UTF-8')), 256), 1, 16), typeof(concat(unhex('{K}'), encode('2:42', 'UTF-8'))), substr(sha2(unhex('{K}') || encode('2:42', 'UTF-8'), 256), 1, 16)")
q("sha2 of string = of its UTF-8", "SELECT sha2('héllo', 256) = sha2(encode('héllo','UTF-8'), 256)")

print("== aggregates")
spark.sql("DROP TABLE IF EXISTS big"); spark.sql("CREATE TABLE big (v BIGINT) USING parquet")
spark.sql("INSERT INTO big VALUES (9223372036854775807), (9223372036854775807), (-1)")
q("SUM(bigint) overflow, ANSI", "SELECT SUM(v) FROM big")
q("try_sum(bigint) overflow", "SELECT try_sum(v) FROM big")
q("SUM(CAST(v AS DECIMAL(38,0)))", "SELECT CAST(SUM(CAST(v AS DECIMAL(38,0))) AS STRING), typeof(SUM(CAST(v AS DECIMAL(38,0)))) FROM big")
q("SUM(DECIMAL(20,0)) type", "SELECT typeof(SUM(CAST(v AS DECIMAL(20,0)))) FROM big")
q("bit_xor(bigint)", "SELECT CAST(bit_xor(v) AS STRING), typeof(bit_xor(v)) FROM big")
q("div, pmod", "SELECT 7 div 2, -7 div 2, typeof(7 div 2), pmod(-7, 2)")
q("row values compare", "SELECT (1, 'b') >= (1, 'a'), (1, 'a') < (2, 'a'), named_struct('a', 1, 'b', 'x') >= (1, 'x')")
q("NTILE/LAG", "SELECT id, NTILE(3) OVER (ORDER BY id) - 1, LAG(id) OVER (ORDER BY id) FROM range(5)")
q("positional params", "SELECT 1")  # exercised through the raw client

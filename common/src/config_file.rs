//! Reading YAML config and spec files with errors that name the file, the key path and
//! what to do. Config structs use `deny_unknown_fields`, so a misspelt key is an error.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

impl ConfigError {
    pub fn invalid(path: &Path, key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: path.to_path_buf(),
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Parses YAML text that came from `path` (used in messages only). Errors name the
/// key path (`datasets.orders.policy.max_level`) as well as the line and column.
///
/// The YAML is deserialized straight into the typed struct, never through an untyped
/// value: a plain `y` or `no` stays a string where the struct expects one.
pub fn parse_yaml<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    let mut key = String::new();
    serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            key = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| {
        let message = e.to_string().lines().next().unwrap_or("invalid YAML").to_string();
        if key.is_empty() || key == "." {
            ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            }
        } else {
            ConfigError::Invalid {
                path: path.to_path_buf(),
                key,
                message,
            }
        }
    })
}

pub fn load_yaml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_yaml(path, &text)
}

/// Resolves a path written in a config file relative to that file's directory.
pub fn relative_to(config: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        config.parent().unwrap_or(Path::new(".")).join(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Small {
        listen: String,
    }

    #[test]
    fn plain_scalars_stay_strings_where_strings_are_expected() {
        let s: Small = parse_yaml(Path::new("x.yaml"), "listen: y\n").unwrap();
        assert_eq!(s.listen, "y");
        let s: Small = parse_yaml(Path::new("x.yaml"), "listen: no\n").unwrap();
        assert_eq!(s.listen, "no");
    }

    #[test]
    fn unknown_keys_are_errors_naming_file_and_key() {
        let e = parse_yaml::<Small>(Path::new("x.yaml"), "listen: a\npassword: b\n").unwrap_err();
        let m = e.to_string();
        assert!(m.starts_with("x.yaml: ") && m.contains("password"), "{m}");
    }
}

//! The Kafka client configuration the tool's consumers and producers share: the brokers, and the
//! properties of a secured cluster from `--command-config FILE` (Java properties, like the Kafka
//! tools' option of the same name: `key=value` lines, `#` and `!` comments) and from environment
//! variables `MILLRACE_KAFKA_<NAME>` (`MILLRACE_KAFKA_SASL_PASSWORD` sets `sasl.password`: the name
//! lowercased, `_` read as `.`), which win over the file. Set once at start-up, read by every
//! client the tool creates.

use anyhow::{Context as _, Result, bail};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use std::sync::{Mutex, OnceLock};

/// Prefix of the environment variables that set client properties.
pub const ENV_PREFIX: &str = "MILLRACE_KAFKA_";

static PROPERTIES: OnceLock<Vec<(String, String)>> = OnceLock::new();

/// Reads the properties (file, then environment) and keeps them for [`properties`].
pub fn init(command_config: Option<&std::path::Path>) -> Result<()> {
    let mut props = match command_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --command-config {}", path.display()))?;
            parse(&text).with_context(|| format!("in --command-config {}", path.display()))?
        }
        None => Vec::new(),
    };
    for (name, value) in std::env::vars() {
        if let Some(rest) = name.strip_prefix(ENV_PREFIX).filter(|r| !r.is_empty()) {
            let key = rest.to_ascii_lowercase().replace('_', ".");
            props.retain(|(k, _)| *k != key);
            props.push((key, value));
        }
    }
    if let Some((k, _)) = props.iter().find(|(k, _)| k == "bootstrap.servers") {
        bail!("{k} is set with --bootstrap or KAFKA_BOOTSTRAP_SERVERS, not in the client properties");
    }
    let _ = PROPERTIES.set(props);
    Ok(())
}

/// The client properties read by [`init`] (none before it).
pub fn properties() -> &'static [(String, String)] {
    PROPERTIES.get().map_or(&[], Vec::as_slice)
}

/// Why a broker refused this tool's connection, when librdkafka said so (wrong credentials, an
/// untrusted certificate): the last such log line.
static REFUSED: Mutex<Option<String>> = Mutex::new(None);

/// The context of every client the tool creates: it keeps librdkafka's reason when a broker refuses
/// the connection, so that an error can say why rather than only "cannot reach".
#[derive(Debug, Clone, Copy, Default)]
pub struct Hooks;

impl ClientContext for Hooks {
    fn log(&self, level: RDKafkaLogLevel, _fac: &str, message: &str) {
        let refused = message.contains("SASL authentication error") || message.contains("certificate verify failed");
        let error = matches!(
            level,
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error
        );
        if error && refused {
            *REFUSED.lock().unwrap_or_else(|p| p.into_inner()) = Some(message.to_owned());
        }
    }
}

impl ConsumerContext for Hooks {}

/// Why a broker refused the tool's connection, if one did.
pub fn refused() -> Option<String> {
    REFUSED.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Parses Java-properties-style `key=value` (or `key: value`) lines.
fn parse(text: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let Some(at) = line.find(['=', ':']) else {
            bail!("line {}: expected key=value", n + 1);
        };
        let (key, value) = (line[..at].trim(), line[at + 1..].trim());
        if key.is_empty() {
            bail!("line {}: the key is empty", n + 1);
        }
        out.push((key.to_owned(), value.to_owned()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_files_parse_like_the_kafka_tools() {
        let text = "# a comment\n! another\nsecurity.protocol=SASL_SSL\nsasl.mechanism : SCRAM-SHA-512\n\n\
                    ssl.ca.location = /etc/ca.pem\n";
        let props = parse(text).unwrap();
        assert_eq!(
            props,
            [
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("ssl.ca.location", "/etc/ca.pem")
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        let err = parse("security.protocol\n").unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
    }
}

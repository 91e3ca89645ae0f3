//! The local broker's secured listeners (scripts/kafka): SASL_SSL with SCRAM-SHA-512 users, and SSL
//! with client certificates (mTLS), with the test CA and certificates `scripts/kafka up` made in
//! `$KAFKA_DATA_DIR/tls`.

use std::path::PathBuf;

/// The SCRAM users `scripts/kafka up` creates (user, password): a super-user, and the one the ACL
/// tests restrict. Test credentials of a broker on 127.0.0.1, not secrets.
pub const ADMIN: (&str, &str) = ("admin", "admin-secret");
/// See [`ADMIN`].
pub const ALICE: (&str, &str) = ("alice", "alice-secret");

fn port(var: &str, offset: u16) -> u16 {
    let plain: u16 = std::env::var("KAFKA_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(9092);
    std::env::var(var).ok().and_then(|p| p.parse().ok()).unwrap_or(plain + offset)
}

/// The directory of the test CA and certificates.
pub fn tls_dir() -> PathBuf {
    crate::tool::data_dir().join("tls")
}

/// A file of [`tls_dir`] as a string (for a librdkafka property).
pub fn tls_file(name: &str) -> String {
    tls_dir().join(name).display().to_string()
}

/// The SASL_SSL listener.
pub fn sasl_bootstrap() -> String {
    format!("127.0.0.1:{}", port("KAFKA_SASL_PORT", 2))
}

/// The SSL listener that requires a client certificate.
pub fn mtls_bootstrap() -> String {
    format!("127.0.0.1:{}", port("KAFKA_MTLS_PORT", 3))
}

/// librdkafka properties for SCRAM-SHA-512 over TLS as `(user, password)`, trusting the test CA.
pub fn scram_properties((user, password): (&str, &str)) -> Vec<(String, String)> {
    [
        ("security.protocol", "SASL_SSL".to_owned()),
        ("sasl.mechanism", "SCRAM-SHA-512".to_owned()),
        ("sasl.username", user.to_owned()),
        ("sasl.password", password.to_owned()),
        ("ssl.ca.location", tls_file("ca.crt")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// librdkafka properties for mTLS with the test client certificate (CN=mtls-client).
pub fn mtls_properties() -> Vec<(String, String)> {
    [
        ("security.protocol", "SSL".to_owned()),
        ("ssl.ca.location", tls_file("ca.crt")),
        ("ssl.certificate.location", tls_file("client.crt")),
        ("ssl.key.location", tls_file("client.key")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Runs Kafka's `AclCommand` against the local broker's plaintext listener (a super-user) with
/// `args` (e.g. `--add --allow-principal User:alice --operation Read --group g`), through
/// `scripts/kafka tool` (a JVM: about two seconds).
pub fn acl(args: &[&str]) -> anyhow::Result<()> {
    let bootstrap = crate::bootstrap();
    let all: Vec<&str> = ["--bootstrap-server", bootstrap.as_str()].into_iter().chain(args.iter().copied()).collect();
    crate::tool::kafka_tool("org.apache.kafka.tools.AclCommand", &all, b"").map(drop)
}

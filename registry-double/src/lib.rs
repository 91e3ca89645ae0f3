//! **A test double**, not a schema registry: an in-process HTTP server answering the subset of the
//! Confluent Schema Registry REST API that Millrace's Avro codec (through
//! `schema_registry_converter`) calls, keeping schemas in memory.
//!
//! Why it exists: no Confluent-compatible registry could be run on the project's machines from the
//! package registries they reach (Confluent's is not on Maven Central; Apicurio's Maven artifacts
//! lack modules its build needs; Karapace is not on PyPI; see `docs/schema-registry.md`). The tests
//! and the codec benchmark use a real registry whenever `SCHEMA_REGISTRY_URL` points at one, and
//! this double otherwise.
//!
//! What it serves (JSON bodies as the Confluent API has them):
//! - `GET /schemas/ids/{id}` → `{"schema": …}`, or 404 with error code 40403;
//! - `POST /subjects/{subject}/versions` `{"schema": …}` → `{"id": …}`: registers (the same schema
//!   text, compared as JSON, gets the same id everywhere; a new schema under a subject is its next
//!   version), 422 (42201) when the schema is not JSON;
//! - `GET /subjects/{subject}/versions/latest` and `/versions/{n}` → `{"subject", "version", "id",
//!   "schema"}`, or 404 with 40401 / 40402;
//! - `GET /subjects` → the subjects.
//!
//! Anything else is 404. With credentials set, a request without the right basic-auth header gets 401.
//! [`RegistryDouble::set_available`]`(false)` simulates an outage: connections are accepted and
//! closed without an answer. It does no compatibility checks, no deletes, no references, no
//! contexts. Every response closes its connection.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The running double. Dropping it stops the server.
pub struct RegistryDouble {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    unavailable: AtomicBool,
    auth: Option<String>,
    requests: AtomicU64,
    schema_fetches: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Schema text by id - 1.
    schemas: Vec<(String, Value)>,
    /// Ids of each subject's versions, in version order.
    subjects: BTreeMap<String, Vec<u32>>,
}

impl RegistryDouble {
    /// Starts the double on `127.0.0.1` (a free port) in the current Tokio runtime.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(None).await
    }

    /// Starts the double requiring HTTP basic auth with `username` and `password`.
    pub async fn start_with_auth(username: &str, password: &str) -> std::io::Result<Self> {
        Self::start_with(Some(basic(username, password))).await
    }

    async fn start_with(auth: Option<String>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared { auth, ..Shared::default() });
        let server = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = server.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, &shared).await;
                });
            }
        });
        Ok(Self { addr, shared, task })
    }

    /// The base URL to configure clients with.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `false`: every connection is closed unanswered (an outage) until set back to `true`.
    pub fn set_available(&self, available: bool) {
        self.shared.unavailable.store(!available, Ordering::SeqCst);
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// `GET /schemas/ids/{id}` requests answered so far (to check a client's cache).
    pub fn schema_fetches(&self) -> u64 {
        self.shared.schema_fetches.load(Ordering::SeqCst)
    }

    /// Registers `schema` under `subject` directly; returns its id.
    pub fn register(&self, subject: &str, schema: &str) -> u32 {
        let parsed = serde_json::from_str(schema).expect("schema is JSON");
        self.shared.state.lock().expect("state").register(subject, schema, parsed)
    }
}

impl Drop for RegistryDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl State {
    fn register(&mut self, subject: &str, text: &str, parsed: Value) -> u32 {
        let id = match self.schemas.iter().position(|(_, v)| *v == parsed) {
            Some(i) => i as u32 + 1,
            None => {
                self.schemas.push((text.to_owned(), parsed));
                self.schemas.len() as u32
            }
        };
        let versions = self.subjects.entry(subject.to_owned()).or_default();
        if !versions.contains(&id) {
            versions.push(id);
        }
        id
    }
}

fn basic(username: &str, password: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let input = format!("{username}:{password}").into_bytes();
    let mut out = String::from("Basic ");
    for chunk in input.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

async fn serve(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    if shared.unavailable.load(Ordering::SeqCst) {
        return Ok(()); // dropped: the client sees the connection closed without an answer
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let (method, target) = (request_line.next().unwrap_or_default(), request_line.next().unwrap_or_default());
    let mut content_length = 0;
    let mut authorization = None;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => content_length = value.trim().parse().unwrap_or(0),
                "authorization" => authorization = Some(value.trim().to_owned()),
                _ => {}
            }
        }
    }
    while buf.len() < head_end + content_length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = &buf[head_end..buf.len().min(head_end + content_length)];
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let (status, reply) = if shared.auth.is_some() && authorization != shared.auth {
        (401, json!({"error_code": 401, "message": "Unauthorized"}))
    } else {
        route(shared, method, target.split('?').next().unwrap_or_default(), body)
    };
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        _ => "Unprocessable Entity",
    };
    let body = reply.to_string();
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/vnd.schemaregistry.v1+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

fn route(shared: &Shared, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let not_found = |code: u32, message: &str| (404, json!({"error_code": code, "message": message}));
    let mut state = shared.state.lock().expect("state");
    match (method, segments.as_slice()) {
        ("GET", ["schemas", "ids", id]) => {
            shared.schema_fetches.fetch_add(1, Ordering::SeqCst);
            match id.parse::<usize>().ok().and_then(|i| state.schemas.get(i.wrapping_sub(1))) {
                Some((text, _)) => (200, json!({"schema": text})),
                None => not_found(40403, "Schema not found"),
            }
        }
        ("GET", ["subjects"]) => (200, json!(state.subjects.keys().collect::<Vec<_>>())),
        ("POST", ["subjects", subject, "versions"]) => {
            let subject = subject.replace("%2F", "/");
            let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let text = request["schema"].as_str().unwrap_or_default().to_owned();
            match serde_json::from_str::<Value>(&text) {
                Ok(parsed) => (200, json!({"id": state.register(&subject, &text, parsed)})),
                Err(e) => (422, json!({"error_code": 42201, "message": format!("Invalid schema: {e}")})),
            }
        }
        ("GET", ["subjects", subject, "versions", version]) => {
            let subject = subject.replace("%2F", "/");
            let Some(versions) = state.subjects.get(&subject) else {
                return not_found(40401, "Subject not found");
            };
            let index = match *version {
                "latest" => versions.len().checked_sub(1),
                v => v.parse::<usize>().ok().and_then(|v| v.checked_sub(1)).filter(|i| *i < versions.len()),
            };
            let Some(index) = index else { return not_found(40402, "Version not found") };
            let id = versions[index];
            let text = &state.schemas[id as usize - 1].0;
            (200, json!({"subject": subject, "version": index + 1, "id": id, "schema": text}))
        }
        _ => not_found(404, "Not found"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_header_is_standard_base64() {
        assert_eq!(basic("Aladdin", "open sesame"), "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
        assert_eq!(basic("u", "p"), "Basic dTpw");
    }

    #[test]
    fn same_schema_same_id_and_versions_per_subject() {
        let mut s = State::default();
        let a = r#"{"type": "string"}"#;
        let b = r#"{"type":"long"}"#;
        assert_eq!(s.register("x", a, serde_json::from_str(a).unwrap()), 1);
        assert_eq!(s.register("y", r#"{"type":"string"}"#, serde_json::from_str(a).unwrap()), 1);
        assert_eq!(s.register("x", b, serde_json::from_str(b).unwrap()), 2);
        assert_eq!(s.subjects["x"], [1, 2]);
    }
}

//! Avro values in the Confluent wire format, with their schemas in a
//! [schema registry](crate::codec::schema_registry).
//!
//! Decoding reads the schema id from the value, fetches that *writer* schema from the registry
//! (once per id, then cached) and resolves the body against the codec's own *reader* schema, the
//! Avro way: fields the reader does not know are skipped, fields the writer did not have take the
//! reader's default. So a field added with a default, or removed, works in both directions. The
//! result is then deserialized into the processor's type with serde.
//!
//! Encoding registers the codec's schema under the subject its [`SubjectStrategy`] names (or finds
//! it already registered; once per subject and codec, then cached) and writes the registry's id in front of
//! the body. With [`Avro::use_latest_schema`] it registers nothing and encodes with the subject's
//! latest registered schema instead (looked up once per subject and codec, then cached).
//!
//! Failures: a wrong magic byte, a schema id the registry does not know, a body that does not match
//! its writer schema (truncated, trailing bytes, another type) or a writer schema the reader cannot
//! resolve are permanent — the record goes to the DLQ with its bytes untouched and, when its header
//! is readable, the schema id in `millrace.schema.id`. An unreachable or failing registry is
//! transient — the record is retried with the pipeline's retry policy.
//!
//! ```no_run
//! use millrace::codec::avro::{Avro, SubjectStrategy};
//! use millrace::codec::schema_registry::{SchemaRegistry, SchemaRegistryConfig};
//! use millrace::typed::{EmitEncoded, Typed, TypedProcessor};
//! use millrace::{Context, Pipeline, PipelineConfig, ProcessError, Record};
//! use serde::{Deserialize, Serialize};
//!
//! const ORDER: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
//!     {"name": "id", "type": "long"}, {"name": "amount_cents", "type": "long"}]}"#;
//! const PAYMENT: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop", "fields": [
//!     {"name": "order", "type": "long"}, {"name": "amount_cents", "type": "long"}]}"#;
//!
//! #[derive(Deserialize)]
//! struct Order { id: i64, amount_cents: i64 }
//! #[derive(Serialize)]
//! struct Payment { order: i64, amount_cents: i64 }
//!
//! struct Billing { payments: Avro }
//! impl TypedProcessor for Billing {
//!     type Input = Order;
//!     async fn process(&self, order: Order, _record: &Record, ctx: &Context) -> Result<(), ProcessError> {
//!         let payment = Payment { order: order.id, amount_cents: order.amount_cents };
//!         ctx.emit_encoded(&self.payments, "payments", Some(order.id.to_string().into_bytes()), &payment).await
//!     }
//! }
//!
//! # async fn run() -> Result<(), millrace::Error> {
//! let registry = SchemaRegistry::new(SchemaRegistryConfig::new(SchemaRegistryConfig::url_from_env()))?;
//! let orders = Avro::new(&registry, ORDER)?;
//! let payments = Avro::new(&registry, PAYMENT)?.subject_strategy(SubjectStrategy::TopicRecordName)?;
//! let config = PipelineConfig::new(PipelineConfig::bootstrap_from_env(), "billing", ["orders"]);
//! Pipeline::new(config, Typed::new(Billing { payments }, orders))?.run_until_signal().await?;
//! # Ok(()) }
//! ```

use crate::codec::schema_registry::{SchemaRegistry, wire};
use crate::codec::{CodecError, Decode, Encode};
use crate::error::ConfigError;
use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use schema_registry_converter::async_impl::avro::AvroEncoder;
use schema_registry_converter::schema_registry_common::{SchemaType, SubjectNameStrategy, SuppliedSchema};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::Arc;

/// How the registry subject of an encoded value is named (as in Confluent's serializers). Decoding
/// does not need it: the value carries its schema id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SubjectStrategy {
    /// `<topic>-value`: one schema (and its versions) per topic. The default.
    #[default]
    TopicName,
    /// `<record full name>`: the same record type shares one subject across topics.
    RecordName,
    /// `<topic>-<record full name>`: several record types per topic.
    TopicRecordName,
}

/// The Avro codec: Confluent wire format, schemas in a schema registry, this codec's schema as the
/// reader schema when decoding and as the registered schema when encoding. Cheap to clone.
#[derive(Clone)]
pub struct Avro {
    registry: SchemaRegistry,
    encoder: Arc<AvroEncoder>,
    readers: Arc<Readers>,
    reader: Arc<Schema>,
    raw: Arc<str>,
    full_name: Option<String>,
    strategy: SubjectStrategy,
    register: bool,
}

impl std::fmt::Debug for Avro {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Avro")
            .field("schema", &self.full_name)
            .field("strategy", &self.strategy)
            .field("register", &self.register)
            .finish_non_exhaustive()
    }
}

impl Avro {
    /// A codec for values of the Avro schema `schema` (JSON), with the topic-name subject strategy
    /// and schema registration on first use. An unparsable schema is rejected here (field
    /// `avro.schema`), at start-up.
    pub fn new(registry: &SchemaRegistry, schema: &str) -> Result<Self, ConfigError> {
        let parsed = Schema::parse_str(schema).map_err(|e| ConfigError::new("avro.schema", e.to_string()))?;
        let full_name = match &parsed {
            Schema::Record(r) => Some(r.name.fullname(None)),
            Schema::Enum(e) => Some(e.name.fullname(None)),
            Schema::Fixed(f) => Some(f.name.fullname(None)),
            _ => None,
        };
        Ok(Self {
            registry: registry.clone(),
            encoder: Arc::new(registry.encoder()),
            readers: Arc::default(),
            reader: Arc::new(parsed),
            raw: schema.into(),
            full_name,
            strategy: SubjectStrategy::TopicName,
            register: true,
        })
    }

    /// Names subjects with `strategy`. The record-name strategies need a named schema (record, enum
    /// or fixed); anything else is rejected (field `avro.subject_strategy`).
    pub fn subject_strategy(mut self, strategy: SubjectStrategy) -> Result<Self, ConfigError> {
        if strategy != SubjectStrategy::TopicName && self.full_name.is_none() {
            return Err(ConfigError::new(
                "avro.subject_strategy",
                format!("{strategy:?} needs a named schema (record, enum or fixed)"),
            ));
        }
        self.strategy = strategy;
        Ok(self)
    }

    /// Registers nothing: encodes with the latest schema registered under the subject (which must
    /// be able to represent the value). For registries where producers may not register schemas.
    pub fn use_latest_schema(mut self) -> Self {
        self.register = false;
        self
    }

    /// The subject a value for `topic` is registered under.
    ///
    /// ```
    /// # use millrace::codec::{avro::*, schema_registry::*};
    /// let registry = SchemaRegistry::new(SchemaRegistryConfig::new("http://127.0.0.1:8081")).unwrap();
    /// let order = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": []}"#;
    /// let codec = Avro::new(&registry, order).unwrap();
    /// assert_eq!(codec.subject("orders"), "orders-value");
    /// let codec = codec.subject_strategy(SubjectStrategy::TopicRecordName).unwrap();
    /// assert_eq!(codec.subject("orders"), "orders-shop.Order");
    /// ```
    pub fn subject(&self, topic: &str) -> String {
        let name = self.full_name.as_deref().unwrap_or_default();
        match self.strategy {
            SubjectStrategy::TopicName => format!("{topic}-value"),
            SubjectStrategy::RecordName => name.to_owned(),
            SubjectStrategy::TopicRecordName => format!("{topic}-{name}"),
        }
    }

    /// The reader (and registered) schema.
    pub fn schema(&self) -> &Schema {
        &self.reader
    }

    fn subject_name_strategy(&self, topic: &str) -> SubjectNameStrategy {
        let name = self.full_name.clone().unwrap_or_default();
        let supplied = || SuppliedSchema::new(self.full_name.clone(), SchemaType::Avro, self.raw.to_string());
        match (self.strategy, self.register) {
            (SubjectStrategy::TopicName, true) => {
                SubjectNameStrategy::TopicNameStrategyWithSchema(topic.to_owned(), false, supplied())
            }
            (SubjectStrategy::TopicName, false) => SubjectNameStrategy::TopicNameStrategy(topic.to_owned(), false),
            (SubjectStrategy::RecordName, true) => SubjectNameStrategy::RecordNameStrategyWithSchema(supplied()),
            (SubjectStrategy::RecordName, false) => SubjectNameStrategy::RecordNameStrategy(name),
            (SubjectStrategy::TopicRecordName, true) => {
                SubjectNameStrategy::TopicRecordNameStrategyWithSchema(topic.to_owned(), supplied())
            }
            (SubjectStrategy::TopicRecordName, false) => {
                SubjectNameStrategy::TopicRecordNameStrategy(topic.to_owned(), name)
            }
        }
    }

    /// Decodes `body`, written with `writer` (schema `id`), resolved against the reader schema.
    fn read(&self, writer: &Schema, id: u32, body: &[u8]) -> Result<Value, CodecError> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| CodecError::Invalid {
            codec: "avro",
            message: format!("schema id {id}: {what}: {e}"),
        };
        let reader = self
            .readers
            .get(id, writer, &self.reader)
            .map_err(|e| invalid("the writer schema cannot be resolved against the reader schema", &e))?;
        let mut rest = body;
        let value =
            reader.read_value(&mut rest).map_err(|e| invalid("the body does not match the writer schema", &e))?;
        if !rest.is_empty() {
            let left = format!("{} of {} bytes left over after the record", rest.len(), body.len());
            return Err(invalid("the body does not match the writer schema", &left));
        }
        Ok(value)
    }
}

impl<T: DeserializeOwned + Send> Decode<T> for Avro {
    async fn decode(&self, bytes: Option<&[u8]>) -> Result<T, CodecError> {
        let (id, body) = wire::split(bytes.ok_or(CodecError::Missing)?)?;
        let decoder = &self.registry.inner.decoder;
        let writer = decoder.get_schema(id).await.map_err(|e| self.registry.error(e, Some(id), None))?;
        let value = self.read(&writer.parsed, id, body)?;
        apache_avro::from_value::<T>(&value).map_err(|e| CodecError::Invalid {
            codec: "avro",
            message: format!("schema id {id}: the record does not fit the reader's type: {e}"),
        })
    }
}

impl<T: Serialize + Sync> Encode<T> for Avro {
    fn encode(&self, topic: &str, value: &T) -> impl Future<Output = Result<Vec<u8>, CodecError>> + Send {
        let strategy = self.subject_name_strategy(topic);
        async move {
            let encoded = self.encoder.encode_struct(value, &strategy).await;
            encoded.map_err(|e| self.registry.error(e, None, Some(&self.encoder)))
        }
    }
}

/// One datum reader per writer schema id, built once: building one resolves both schemas' named
/// types, which otherwise costs more than decoding a 1 KB record. A reader borrows its schemas for
/// `'static`, so the schemas are leaked — once per codec (reader) and once per codec and writer id
/// that decoded successfully, a bounded set (ids must exist in the registry), as
/// `schema_registry_converter` does for its own resolved schemas.
#[derive(Default)]
struct Readers {
    reader_schema: std::sync::OnceLock<&'static Schema>,
    by_id: std::sync::RwLock<std::collections::HashMap<u32, Arc<GenericDatumReader<'static>>>>,
}

impl Readers {
    fn get(
        &self,
        id: u32,
        writer: &Schema,
        reader: &Schema,
    ) -> Result<Arc<GenericDatumReader<'static>>, apache_avro::Error> {
        if let Some(r) = self.by_id.read().expect("readers lock").get(&id) {
            return Ok(r.clone());
        }
        let reader_schema: &'static Schema = self.reader_schema.get_or_init(|| Box::leak(Box::new(reader.clone())));
        // Build against a borrowed writer first, so a writer that does not resolve leaks nothing.
        GenericDatumReader::builder(writer).reader_schema(reader_schema).build()?;
        let writer: &'static Schema = Box::leak(Box::new(writer.clone()));
        // The same schema on both sides (the common case) needs no resolution step per record.
        let same = writer.canonical_form() == reader_schema.canonical_form();
        let built = Arc::new(if same {
            GenericDatumReader::builder(writer).build()?
        } else {
            GenericDatumReader::builder(writer).reader_schema(reader_schema).build()?
        });
        Ok(self.by_id.write().expect("readers lock").entry(id).or_insert(built).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::schema_registry::SchemaRegistryConfig;

    #[test]
    fn bad_schemas_and_strategies_are_rejected_at_start_up() {
        let registry = SchemaRegistry::new(SchemaRegistryConfig::new("http://127.0.0.1:1")).unwrap();
        assert_eq!(Avro::new(&registry, r#"{"type": "recrod"}"#).unwrap_err().field, "avro.schema");
        let primitive = Avro::new(&registry, r#""string""#).unwrap();
        assert_eq!(primitive.subject("t"), "t-value");
        let err = primitive.subject_strategy(SubjectStrategy::RecordName).unwrap_err();
        assert_eq!(err.field, "avro.subject_strategy");
        let order = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": []}"#;
        let codec = Avro::new(&registry, order).unwrap().subject_strategy(SubjectStrategy::RecordName).unwrap();
        assert_eq!(codec.subject("t"), "shop.Order");
    }

    #[test]
    fn an_unreachable_registry_is_a_transient_decode_failure() {
        let registry = SchemaRegistry::new(SchemaRegistryConfig::new("http://127.0.0.1:1")).unwrap();
        let codec = Avro::new(&registry, r#""string""#).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let err = runtime.block_on(Decode::<String>::decode(&codec, Some(&[0, 0, 0, 0, 1, 2, b'x']))).unwrap_err();
        assert!(err.is_transient(), "{err}");
        // Bytes that cannot be Avro never reach the registry.
        let err = runtime.block_on(Decode::<String>::decode(&codec, Some(b"{}"))).unwrap_err();
        assert!(!err.is_transient(), "{err}");
    }
}

//! Codecs: how record values turn into typed values and back. A decode failure is permanent and sends
//! the record to the DLQ with its bytes untouched (error kind `decode`), unless the codec says it is
//! transient (a schema registry that cannot be reached): then the record is retried like any
//! transient failure.
//!
//! The traits are async because a codec may have to ask a schema registry for a schema (see
//! [`avro`]); the codecs here ([`Raw`], [`Utf8`], [`Json`]) never wait.
//!
//! ```
//! use millrace::codec::{Decode, Encode, Json};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, PartialEq, Debug)]
//! struct Order { id: u64 }
//!
//! # futures::executor::block_on(async {
//! let bytes = Json.encode("orders", &Order { id: 7 }).await.unwrap();
//! assert_eq!(Decode::<Order>::decode(&Json, Some(&bytes)).await.unwrap(), Order { id: 7 });
//! assert!(Decode::<Order>::decode(&Json, Some(b"{oops")).await.is_err());
//! assert!(Decode::<Order>::decode(&Json, None).await.is_err()); // a tombstone has no order in it
//! # });
//! ```

pub mod avro;
pub mod schema_registry;

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::future::{Future, ready};

/// Why a value could not be decoded or encoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The record has no value (a tombstone) where one is required.
    #[error("the record has no value")]
    Missing,
    /// The bytes (or the value to encode) are not valid for this codec.
    #[error("{codec}: {message}")]
    Invalid {
        /// The codec's name.
        codec: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The value names a schema id the schema registry does not know.
    #[error("schema id {id} is unknown to the schema registry")]
    UnknownSchema {
        /// The id read from the value's header.
        id: u32,
    },
    /// The schema registry could not be reached or failed (connection refused, timeout, a 5xx, a
    /// refused credential): transient, the record is retried.
    #[error("schema registry unavailable: {message}")]
    RegistryUnavailable {
        /// What went wrong.
        message: String,
    },
}

impl CodecError {
    /// Whether retrying can help: only when the schema registry was unavailable. Every other codec
    /// error is about the bytes or the value, which a retry does not change.
    pub fn is_transient(&self) -> bool {
        matches!(self, CodecError::RegistryUnavailable { .. })
    }
}

/// Turns value bytes into `T`.
pub trait Decode<T>: Send + Sync + 'static {
    /// Decodes a record value (`None` for a null value).
    fn decode(&self, bytes: Option<&[u8]>) -> impl Future<Output = Result<T, CodecError>> + Send;
}

/// Turns `T` into value bytes for a record to `topic` (the topic matters to codecs whose schema
/// subject is named after it).
pub trait Encode<T>: Send + Sync + 'static {
    /// Encodes a value.
    fn encode(&self, topic: &str, value: &T) -> impl Future<Output = Result<Vec<u8>, CodecError>> + Send;
}

/// The value bytes as they are.
#[derive(Debug, Clone, Copy, Default)]
pub struct Raw;

impl Decode<Vec<u8>> for Raw {
    fn decode(&self, bytes: Option<&[u8]>) -> impl Future<Output = Result<Vec<u8>, CodecError>> + Send {
        ready(bytes.map(<[u8]>::to_vec).ok_or(CodecError::Missing))
    }
}

impl Encode<Vec<u8>> for Raw {
    fn encode(&self, _topic: &str, value: &Vec<u8>) -> impl Future<Output = Result<Vec<u8>, CodecError>> + Send {
        ready(Ok(value.clone()))
    }
}

/// UTF-8 text.
#[derive(Debug, Clone, Copy, Default)]
pub struct Utf8;

impl Decode<String> for Utf8 {
    fn decode(&self, bytes: Option<&[u8]>) -> impl Future<Output = Result<String, CodecError>> + Send {
        ready(bytes.ok_or(CodecError::Missing).and_then(|bytes| {
            String::from_utf8(bytes.to_vec())
                .map_err(|e| CodecError::Invalid { codec: "utf-8", message: e.to_string() })
        }))
    }
}

impl Encode<String> for Utf8 {
    fn encode(&self, _topic: &str, value: &String) -> impl Future<Output = Result<Vec<u8>, CodecError>> + Send {
        ready(Ok(value.as_bytes().to_vec()))
    }
}

/// JSON through serde.
///
/// Decoding is strict at the top level: a value whose type is a struct with named fields must be a
/// JSON object. serde on its own also accepts the field values as an array in declaration order
/// (`[7, 100, "EUR"]` for `Order { id, amount_cents, currency }`), which silently turns a reordered
/// or foreign payload into wrong data; `Json` rejects it ("expected a JSON object for Order, found
/// an array"), so the record goes to the DLQ with kind `decode`. `Option<S>`, `Box<S>` and newtype
/// wrappers of such a struct are treated like the struct. Types whose JSON form is an array
/// (`Vec<T>`, tuples, tuple structs) still decode from arrays. Structs *nested* inside the value keep
/// serde's default and accept arrays; reject those with a custom `Deserialize` if it matters.
///
/// ```
/// use millrace::codec::{Decode, Json};
///
/// #[derive(serde::Deserialize, Debug)]
/// struct Order { id: u64, amount_cents: u64 }
///
/// # futures::executor::block_on(async {
/// let err = Decode::<Order>::decode(&Json, Some(b"[7, 100]")).await.unwrap_err();
/// assert_eq!(err.to_string(), "json: expected a JSON object for Order, found an array");
/// assert_eq!(Decode::<Vec<u64>>::decode(&Json, Some(b"[7, 100]")).await.unwrap(), [7, 100]);
/// # });
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl<T: DeserializeOwned + Send> Decode<T> for Json {
    fn decode(&self, bytes: Option<&[u8]>) -> impl Future<Output = Result<T, CodecError>> + Send {
        ready(bytes.ok_or(CodecError::Missing).and_then(|bytes| {
            // Only an array can be a struct in disguise; the probe runs for those alone.
            if starts_array(bytes)
                && let Some(name) = json_strict::struct_name::<T>()
            {
                let message = format!("expected a JSON object for {name}, found an array");
                return Err(CodecError::Invalid { codec: "json", message });
            }
            serde_json::from_slice(bytes).map_err(|e| CodecError::Invalid { codec: "json", message: e.to_string() })
        }))
    }
}

/// Whether the first non-whitespace byte of a JSON text opens an array.
fn starts_array(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r')) == Some(&b'[')
}

impl<T: Serialize + Sync> Encode<T> for Json {
    fn encode(&self, _topic: &str, value: &T) -> impl Future<Output = Result<Vec<u8>, CodecError>> + Send {
        ready(serde_json::to_vec(value).map_err(|e| CodecError::Invalid { codec: "json", message: e.to_string() }))
    }
}

/// Finds out, without any input, whether a type deserializes as a struct with named fields: a
/// deserializer that answers every request with an error saying what was asked for.
mod json_strict {
    use serde::de::{self, Deserialize, Deserializer, Visitor};
    use std::fmt;

    /// The struct's name when `T` is a struct with named fields (also through `Option`, `Box` and
    /// newtype wrappers); `None` for every other shape.
    pub(super) fn struct_name<'de, T: Deserialize<'de>>() -> Option<&'static str> {
        match T::deserialize(Probe) {
            Err(Asked::Struct(name)) => Some(name),
            _ => None,
        }
    }

    struct Probe;

    /// What the probed type asked for.
    #[derive(Debug)]
    enum Asked {
        Struct(&'static str),
        Other,
    }

    impl fmt::Display for Asked {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("probe")
        }
    }

    impl std::error::Error for Asked {}

    impl de::Error for Asked {
        fn custom<M: fmt::Display>(_msg: M) -> Self {
            Asked::Other
        }
    }

    impl<'de> Deserializer<'de> for Probe {
        type Error = Asked;

        fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Asked> {
            Err(Asked::Other)
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            name: &'static str,
            _fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Asked> {
            Err(Asked::Struct(name))
        }

        // JSON has no wrapper for these: the value inside is what the bytes must be.
        fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Asked> {
            visitor.visit_some(self)
        }

        fn deserialize_newtype_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            visitor: V,
        ) -> Result<V::Value, Asked> {
            visitor.visit_newtype_struct(self)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
            unit_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use futures::executor::block_on;

    #[test]
    fn utf8_and_raw_round_trip_and_reject() {
        block_on(async {
            assert_eq!(Utf8.decode(Some("héllo".as_bytes())).await.unwrap(), "héllo");
            assert!(matches!(Utf8.decode(Some(&[0xff, 0xfe])).await, Err(CodecError::Invalid { .. })));
            assert!(matches!(Utf8.decode(None).await, Err(CodecError::Missing)));
            assert_eq!(Utf8.encode("t", &"é".to_owned()).await.unwrap(), "é".as_bytes());
            assert_eq!(Raw.decode(Some(&[0, 1, 2])).await.unwrap(), vec![0, 1, 2]);
            assert_eq!(Raw.encode("t", &vec![9]).await.unwrap(), vec![9]);
        })
    }

    #[test]
    fn only_registry_outages_are_transient() {
        assert!(CodecError::RegistryUnavailable { message: "connection refused".into() }.is_transient());
        assert!(!CodecError::UnknownSchema { id: 7 }.is_transient());
        assert!(!CodecError::Missing.is_transient());
        assert!(!CodecError::Invalid { codec: "json", message: "x".into() }.is_transient());
    }

    #[test]
    fn json_reports_type_errors() {
        #[derive(serde::Deserialize, serde::Serialize, Debug)]
        struct Payment {
            #[allow(dead_code)]
            amount: u64,
        }
        let err = block_on(Decode::<Payment>::decode(&Json, Some(br#"{"amount": "ten"}"#))).unwrap_err();
        assert!(err.to_string().starts_with("json: invalid type"), "{err}");
    }

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Order {
        id: u64,
        amount_cents: u64,
        currency: String,
    }

    #[test]
    fn json_rejects_an_array_for_a_struct_with_a_clear_message() {
        let order = |json: &str| block_on(Decode::<Order>::decode(&Json, Some(json.as_bytes())));
        let err = order(" \n\t[7, 100, \"EUR\"]").unwrap_err();
        assert!(matches!(err, CodecError::Invalid { codec: "json", .. }));
        assert_eq!(err.to_string(), "json: expected a JSON object for Order, found an array");
        let wrapped = block_on(Decode::<Option<Box<Order>>>::decode(&Json, Some(br#"[7, 100, "EUR"]"#)));
        assert!(wrapped.unwrap_err().to_string().contains("expected a JSON object for Order"));
        let object = order(r#"{"id": 7, "amount_cents": 100, "currency": "EUR"}"#).unwrap();
        assert_eq!(object, Order { id: 7, amount_cents: 100, currency: "EUR".into() });
    }

    #[test]
    fn json_still_decodes_arrays_into_array_shaped_types() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Pair(u32, String);
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Ids(Vec<u32>);
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Batch {
            orders: Vec<Order>,
        }
        assert_eq!(block_on(Decode::<Vec<u32>>::decode(&Json, Some(b"[1, 2, 3]"))).unwrap(), [1, 2, 3]);
        assert_eq!(block_on(Decode::<(u8, bool)>::decode(&Json, Some(b"[1, true]"))).unwrap(), (1, true));
        assert_eq!(block_on(Decode::<Pair>::decode(&Json, Some(br#"[1, "a"]"#))).unwrap(), Pair(1, "a".into()));
        assert_eq!(block_on(Decode::<Ids>::decode(&Json, Some(b"[4]"))).unwrap(), Ids(vec![4]));
        let orders = block_on(Decode::<Vec<Order>>::decode(
            &Json,
            Some(br#"[{"id": 1, "amount_cents": 2, "currency": "EUR"}]"#),
        ));
        assert_eq!(orders.unwrap().len(), 1);
        // Documented limit: a nested struct keeps serde's default.
        let nested = block_on(Decode::<Batch>::decode(&Json, Some(br#"{"orders": [[1, 2, "EUR"]]}"#))).unwrap();
        assert_eq!(nested.orders, [Order { id: 1, amount_cents: 2, currency: "EUR".into() }]);
    }
}

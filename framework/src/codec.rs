//! Codecs: how record values turn into typed values and back. A decode failure is permanent and sends
//! the record to the DLQ with its bytes untouched (error kind `decode`).
//!
//! ```
//! use millrace::codec::{Decode, Encode, Json};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, PartialEq, Debug)]
//! struct Order { id: u64 }
//!
//! let bytes = Json.encode(&Order { id: 7 }).unwrap();
//! assert_eq!(Decode::<Order>::decode(&Json, Some(&bytes)).unwrap(), Order { id: 7 });
//! assert!(Decode::<Order>::decode(&Json, Some(b"{oops")).is_err());
//! assert!(Decode::<Order>::decode(&Json, None).is_err()); // a tombstone has no order in it
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a value could not be decoded or encoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The record has no value (a tombstone) where one is required.
    #[error("the record has no value")]
    Missing,
    /// The bytes are not valid for this codec.
    #[error("{codec}: {message}")]
    Invalid {
        /// The codec's name.
        codec: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// Turns value bytes into `T`.
pub trait Decode<T>: Send + Sync + 'static {
    /// Decodes a record value (`None` for a null value).
    fn decode(&self, bytes: Option<&[u8]>) -> Result<T, CodecError>;
}

/// Turns `T` into value bytes.
pub trait Encode<T>: Send + Sync + 'static {
    /// Encodes a value.
    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError>;
}

/// The value bytes as they are.
#[derive(Debug, Clone, Copy, Default)]
pub struct Raw;

impl Decode<Vec<u8>> for Raw {
    fn decode(&self, bytes: Option<&[u8]>) -> Result<Vec<u8>, CodecError> {
        bytes.map(<[u8]>::to_vec).ok_or(CodecError::Missing)
    }
}

impl Encode<Vec<u8>> for Raw {
    fn encode(&self, value: &Vec<u8>) -> Result<Vec<u8>, CodecError> {
        Ok(value.clone())
    }
}

/// UTF-8 text.
#[derive(Debug, Clone, Copy, Default)]
pub struct Utf8;

impl Decode<String> for Utf8 {
    fn decode(&self, bytes: Option<&[u8]>) -> Result<String, CodecError> {
        let bytes = bytes.ok_or(CodecError::Missing)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| CodecError::Invalid { codec: "utf-8", message: e.to_string() })
    }
}

impl Encode<String> for Utf8 {
    fn encode(&self, value: &String) -> Result<Vec<u8>, CodecError> {
        Ok(value.as_bytes().to_vec())
    }
}

/// JSON through serde.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl<T: DeserializeOwned> Decode<T> for Json {
    fn decode(&self, bytes: Option<&[u8]>) -> Result<T, CodecError> {
        let bytes = bytes.ok_or(CodecError::Missing)?;
        serde_json::from_slice(bytes).map_err(|e| CodecError::Invalid { codec: "json", message: e.to_string() })
    }
}

impl<T: Serialize> Encode<T> for Json {
    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        serde_json::to_vec(value).map_err(|e| CodecError::Invalid { codec: "json", message: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_and_raw_round_trip_and_reject() {
        assert_eq!(Utf8.decode(Some("héllo".as_bytes())).unwrap(), "héllo");
        assert!(matches!(Utf8.decode(Some(&[0xff, 0xfe])), Err(CodecError::Invalid { .. })));
        assert!(matches!(Utf8.decode(None), Err(CodecError::Missing)));
        assert_eq!(Raw.decode(Some(&[0, 1, 2])).unwrap(), vec![0, 1, 2]);
        assert_eq!(Raw.encode(&vec![9]).unwrap(), vec![9]);
    }

    #[test]
    fn json_reports_type_errors() {
        #[derive(serde::Deserialize, serde::Serialize, Debug)]
        struct Payment {
            #[allow(dead_code)]
            amount: u64,
        }
        let err = Decode::<Payment>::decode(&Json, Some(br#"{"amount": "ten"}"#)).unwrap_err();
        assert!(err.to_string().starts_with("json: invalid type"), "{err}");
    }
}

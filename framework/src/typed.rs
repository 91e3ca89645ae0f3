//! Typed processors: declare the input type and a codec; the runtime decodes before calling the
//! processor. Records that do not decode go to the DLQ (error kind `decode`, bytes untouched) without
//! reaching the processor; a codec that could not reach its schema registry fails the attempt as
//! transient instead, so the record is retried. Outputs are encoded with [`EmitEncoded::emit_encoded`]
//! (any [`Encode`] codec) or `ctx.emit_json`.
//!
//! ```no_run
//! use millrace::codec::Json;
//! use millrace::typed::{Typed, TypedProcessor};
//! use millrace::{Context, OutputRecord, Pipeline, PipelineConfig, ProcessError, Record};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize)]
//! struct Order { id: u64, amount_cents: u64 }
//! #[derive(Serialize)]
//! struct Payment { order: u64, amount_cents: u64 }
//!
//! struct Billing;
//! impl TypedProcessor for Billing {
//!     type Input = Order;
//!     async fn process(&self, order: Order, _record: &Record, ctx: &Context) -> Result<(), ProcessError> {
//!         let payment = Payment { order: order.id, amount_cents: order.amount_cents };
//!         ctx.emit_json("payments", Some(order.id.to_string().into_bytes()), &payment).await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn run() -> Result<(), millrace::Error> {
//! let config = PipelineConfig::new(PipelineConfig::bootstrap_from_env(), "billing", ["orders"]);
//! Pipeline::new(config, Typed::new(Billing, Json))?.run_until_signal().await?;
//! # Ok(()) }
//! ```

use crate::codec::{CodecError, Decode, Encode};
use crate::context::Context;
use crate::error::ProcessError;
use crate::processor::Processor;
use crate::record::{OutputRecord, Record};
use std::future::Future;
use std::marker::PhantomData;

/// A processor of decoded values.
pub trait TypedProcessor: Send + Sync + 'static {
    /// The decoded input.
    type Input: Send;

    /// Handles one decoded record; `record` still has the raw bytes, key and headers.
    fn process(
        &self,
        input: Self::Input,
        record: &Record,
        ctx: &Context,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// The name written into DLQ records. Defaults to the type's name.
    fn name(&self) -> &str {
        let full = std::any::type_name::<Self>();
        full.rsplit("::").next().unwrap_or(full)
    }
}

/// Adapts a [`TypedProcessor`] and a [`Decode`] for its input into a [`Processor`].
pub struct Typed<P, C> {
    processor: P,
    codec: C,
    _input: PhantomData<fn() -> P>,
}

impl<P, C> Typed<P, C> {
    /// Decodes with `codec`, then calls `processor`.
    pub fn new(processor: P, codec: C) -> Self {
        Self { processor, codec, _input: PhantomData }
    }
}

impl<P, C> Processor for Typed<P, C>
where
    P: TypedProcessor,
    C: Decode<P::Input>,
{
    async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
        let input = match self.codec.decode(record.value.as_deref()).await {
            Ok(input) => input,
            Err(e) if e.is_transient() => return Err(ProcessError::transient(e)),
            Err(e) => return Err(ProcessError::decode(e)),
        };
        self.processor.process(input, record, ctx).await
    }

    fn name(&self) -> &str {
        self.processor.name()
    }
}

/// Emitting typed outputs through a codec: `ctx.emit_encoded(&codec, topic, key, &value)`.
///
/// ```no_run
/// use millrace::codec::Json;
/// use millrace::typed::EmitEncoded;
/// # async fn f(ctx: &millrace::Context) -> Result<(), millrace::ProcessError> {
/// #[derive(serde::Serialize)]
/// struct Payment { order: u64 }
/// ctx.emit_encoded(&Json, "payments", Some(b"7".to_vec()), &Payment { order: 7 }).await?;
/// # Ok(()) }
/// ```
pub trait EmitEncoded {
    /// Encodes `value` with `codec` for `topic` and emits it (its broker acknowledgement gates the
    /// input record's completion, as for [`Context::emit`]). An encoding failure is permanent, except
    /// an unavailable schema registry, which is transient (the record is retried).
    fn emit_encoded<T, E>(
        &self,
        codec: &E,
        topic: &str,
        key: Option<Vec<u8>>,
        value: &T,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send
    where
        T: Sync,
        E: Encode<T>;
}

impl EmitEncoded for Context {
    async fn emit_encoded<T, E>(
        &self,
        codec: &E,
        topic: &str,
        key: Option<Vec<u8>>,
        value: &T,
    ) -> Result<(), ProcessError>
    where
        T: Sync,
        E: Encode<T>,
    {
        let bytes = codec.encode(topic, value).await.map_err(encode_error)?;
        let mut out = OutputRecord::to(topic).value(bytes);
        out.key = key;
        self.emit(out).await?;
        Ok(())
    }
}

fn encode_error(e: CodecError) -> ProcessError {
    if e.is_transient() { ProcessError::transient(e) } else { ProcessError::permanent(e) }
}

//! Typed processors: declare the input type and a codec; the runtime decodes before calling the
//! processor. Records that do not decode go to the DLQ (error kind `decode`, bytes untouched) without
//! reaching the processor.
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

use crate::codec::Decode;
use crate::context::Context;
use crate::error::ProcessError;
use crate::processor::Processor;
use crate::record::Record;
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
        let input = self.codec.decode(record.value.as_deref()).map_err(ProcessError::decode)?;
        self.processor.process(input, record, ctx).await
    }

    fn name(&self) -> &str {
        self.processor.name()
    }
}

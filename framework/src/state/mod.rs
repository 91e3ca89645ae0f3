//! The state a partition's commits rest on, each piece with one owner: the completed prefix of
//! offsets ([`offsets`], owned by the partition task), exactly-once mode's outputs waiting by offset
//! for their transaction (`pending`, owned by the partition's handle), and the partitions this
//! member owns now (`assignments`, owned by the rebalance hooks); and how much work is in flight
//! under the total bounds (`backpressure`, owned by the pipeline, counted into by the handles).

pub(crate) mod assignments;
pub(crate) mod backpressure;
pub mod offsets;
pub(crate) mod pending;

//! What is safe to commit for one partition.
//!
//! Records finish out of order when different keys run concurrently, but Kafka stores one offset per
//! partition: "everything before this is done". [`OffsetTracker`] keeps the offsets that were polled
//! and are not finished yet, and answers with the end of the contiguous finished prefix. Only offsets
//! actually polled are tracked, so gaps (compaction, transaction markers) count as done.
//!
//! A record that failed is simply never completed: the committable offset stays at it for as long as
//! the partition is owned, so nothing after a failure is ever committed past it (invariant I2).

use std::collections::VecDeque;

/// Tracks polled-but-unfinished offsets of one partition and yields the committable offset.
///
/// ```
/// use millrace::state::offsets::OffsetTracker;
///
/// let mut t = OffsetTracker::new();
/// for o in 10..13 {
///     t.track(o);
/// }
/// t.complete(11);
/// assert_eq!(t.committable(), Some(10)); // 10 is still running: commit must not pass it
/// t.complete(10);
/// assert_eq!(t.committable(), Some(12)); // 10 and 11 are done; 12 is next
/// t.complete(12);
/// assert_eq!(t.committable(), Some(13));
/// ```
#[derive(Debug, Default, Clone)]
pub struct OffsetTracker {
    /// Tracked offsets in ascending order, with whether each has finished.
    window: VecDeque<(i64, bool)>,
    /// One past the highest offset ever tracked (the next offset to consume).
    next: Option<i64>,
}

impl OffsetTracker {
    /// An empty tracker: nothing polled yet, nothing to commit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `offset` was polled and is now in flight.
    ///
    /// Offsets must be tracked in ascending order (Kafka delivers a partition in order); an offset at
    /// or below one already tracked is ignored, as it can only be a redelivery of tracked work.
    pub fn track(&mut self, offset: i64) -> bool {
        if self.next.is_some_and(|next| offset < next) {
            return false;
        }
        self.window.push_back((offset, false));
        self.next = Some(offset + 1);
        true
    }

    /// Marks `offset` finished. Unknown offsets are ignored. Returns whether it was in flight.
    pub fn complete(&mut self, offset: i64) -> bool {
        // Offsets are usually contiguous, so the position is almost always `offset - first`.
        let guess = self.window.front().map_or(usize::MAX, |&(first, _)| offset.wrapping_sub(first) as usize);
        let idx = if self.window.get(guess).is_some_and(|&(o, _)| o == offset) {
            guess
        } else {
            match self.window.binary_search_by_key(&offset, |&(o, _)| o) {
                Ok(idx) => idx,
                Err(_) => return false,
            }
        };
        let was_pending = !self.window[idx].1;
        self.window[idx].1 = true;
        while self.window.front().is_some_and(|&(_, done)| done) {
            self.window.pop_front();
        }
        was_pending
    }

    /// The offset to commit: the lowest unfinished offset, or one past the last tracked offset when
    /// all are finished. `None` when nothing was ever tracked.
    pub fn committable(&self) -> Option<i64> {
        match self.window.front() {
            Some(&(offset, _)) => Some(offset),
            None => self.next,
        }
    }

    /// Number of tracked offsets not yet finished.
    pub fn pending(&self) -> usize {
        self.window.iter().filter(|(_, done)| !done).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn empty_has_nothing_to_commit() {
        assert_eq!(OffsetTracker::new().committable(), None);
    }

    #[test]
    fn gaps_between_polled_offsets_count_as_done() {
        let mut t = OffsetTracker::new();
        t.track(5);
        t.track(9); // 6..=8 were compacted away or were transaction markers
        t.complete(5);
        assert_eq!(t.committable(), Some(9));
        t.complete(9);
        assert_eq!(t.committable(), Some(10));
    }

    #[test]
    fn redelivered_lower_offset_is_ignored() {
        let mut t = OffsetTracker::new();
        t.track(3);
        assert!(!t.track(2));
        assert!(!t.track(3));
        assert_eq!(t.committable(), Some(3));
    }

    proptest! {
        /// For any order of completions and failures, the committable offset never passes an
        /// incomplete or failed offset, and reaches the end when all complete.
        #[test]
        fn never_commits_past_unfinished(
            start in 0i64..1_000,
            gaps in proptest::collection::vec(1i64..4, 1..200),
            order_seed in proptest::collection::vec(any::<u32>(), 1..200),
            fail_mask in proptest::collection::vec(prop::bool::weighted(0.1), 1..200),
        ) {
            let mut offsets = Vec::new();
            let mut o = start;
            for g in &gaps { offsets.push(o); o += g; }
            let end = *offsets.last().unwrap() + 1;
            let mut t = OffsetTracker::new();
            for &o in &offsets { t.track(o); }

            // a permutation of the offsets driven by the seeds
            let mut order: Vec<(u32, i64)> = offsets.iter().enumerate()
                .map(|(i, &o)| (order_seed[i % order_seed.len()].wrapping_mul(i as u32 + 1), o)).collect();
            order.sort();
            let failed: Vec<i64> = offsets.iter().enumerate()
                .filter(|(i, _)| fail_mask[i % fail_mask.len()]).map(|(_, &o)| o).collect();

            let mut done = std::collections::BTreeSet::new();
            for (_, o) in &order {
                if failed.contains(o) { continue; }
                t.complete(*o);
                done.insert(*o);
                let c = t.committable().unwrap();
                // every tracked offset below c is done
                for &x in offsets.iter().take_while(|&&x| x < c) {
                    prop_assert!(done.contains(&x), "committed {} past unfinished {}", c, x);
                }
            }
            let c = t.committable().unwrap();
            match failed.first() {
                Some(&f) => prop_assert!(c <= f, "committed {} past failed {}", c, f),
                None => prop_assert_eq!(c, end),
            }
            if failed.is_empty() { prop_assert_eq!(t.pending(), 0); }
        }
    }
}

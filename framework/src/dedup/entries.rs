//! The changelog's record formats. Since issue 17 a changelog record carries a batch of keys (every
//! key a partition recorded in one burst, or in one transaction), so the store costs one changelog
//! record per burst instead of one per input record:
//!
//! - key: [`BATCH_KEY_PREFIX`] followed by 16 random bytes (unique, so compaction never drops a
//!   batch; the topic's retention by age does, a TTL after it was written);
//! - value: a version byte (1), then per entry the key's length (4 bytes big-endian), the key, and
//!   its first-seen time (8 bytes big-endian, milliseconds since the epoch).
//!
//! A changelog written by an earlier version holds one record per key (key: the idempotency key;
//! value: the first-seen time, 8 bytes); [`changelog_entries`] reads both.

/// What starts the record key of a batch of changelog entries.
pub const BATCH_KEY_PREFIX: &[u8] = b"\x00millrace.dedup-batch\x00";

/// The version byte of a batch's value.
const VERSION: u8 = 1;

/// Largest value a batch record is given (well below the broker's default `message.max.bytes` of
/// 1 MiB); a burst with more is split into several records.
pub(crate) const MAX_BATCH_BYTES: usize = 256 * 1024;

/// The `(idempotency key, first seen ms)` entries of one changelog record, in either format. A
/// record that is neither (no key, a truncated batch) yields what could be read of it.
///
/// ```
/// use millrace::dedup::changelog_entries;
/// // A record of the per-key format (before issue 17).
/// let old = changelog_entries(Some(b"order-7"), Some(&1_700_000_000_000i64.to_be_bytes()));
/// assert_eq!(old, vec![(b"order-7".to_vec(), 1_700_000_000_000)]);
/// ```
pub fn changelog_entries(key: Option<&[u8]>, value: Option<&[u8]>) -> Vec<(Vec<u8>, i64)> {
    let mut out = Vec::new();
    for_each_entry(key, value, |k, at| out.push((k.to_vec(), at)));
    out
}

/// Calls `f` with each `(key, first seen ms)` entry of a changelog record; returns how many.
pub(crate) fn for_each_entry(key: Option<&[u8]>, value: Option<&[u8]>, mut f: impl FnMut(&[u8], i64)) -> usize {
    let (Some(key), Some(value)) = (key, value) else { return 0 };
    if !key.starts_with(BATCH_KEY_PREFIX) {
        return match <[u8; 8]>::try_from(value) {
            Ok(at) => {
                f(key, i64::from_be_bytes(at));
                1
            }
            Err(_) => 0,
        };
    }
    let Some((&VERSION, mut rest)) = value.split_first() else { return 0 };
    let mut n = 0;
    while rest.len() >= 4 {
        let len = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let Some(entry) = rest.get(4..4 + len + 8) else { break };
        let at = i64::from_be_bytes(entry[len..].try_into().expect("8 bytes"));
        f(&entry[..len], at);
        n += 1;
        rest = &rest[4 + len + 8..];
    }
    n
}

/// Encodes `entries` as batch values of at most [`MAX_BATCH_BYTES`] each (an entry larger than
/// that gets a value of its own).
pub(crate) fn encode<'k>(entries: impl IntoIterator<Item = (&'k [u8], i64)>) -> Vec<Vec<u8>> {
    let mut values = Vec::new();
    let mut value = vec![VERSION];
    for (key, at) in entries {
        if value.len() > 1 && value.len() + 12 + key.len() > MAX_BATCH_BYTES {
            values.push(std::mem::replace(&mut value, vec![VERSION]));
        }
        value.extend_from_slice(&(key.len() as u32).to_be_bytes());
        value.extend_from_slice(key);
        value.extend_from_slice(&at.to_be_bytes());
    }
    if value.len() > 1 {
        values.push(value);
    }
    values
}

/// A new, unique batch record key.
pub(crate) fn batch_key() -> Vec<u8> {
    let mut key = Vec::with_capacity(BATCH_KEY_PREFIX.len() + 16);
    key.extend_from_slice(BATCH_KEY_PREFIX);
    key.extend_from_slice(&rand::random::<u128>().to_be_bytes());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_round_trips_and_splits_at_the_size_bound() {
        let keys: Vec<Vec<u8>> = (0..30_000).map(|i| format!("key-{i}").into_bytes()).collect();
        let entries = || keys.iter().enumerate().map(|(i, k)| (&k[..], 1_000 + i as i64));
        let values = encode(entries());
        assert!(values.len() > 1, "30,000 entries of ~21 bytes exceed one batch");
        assert!(values.iter().all(|v| v.len() <= MAX_BATCH_BYTES));
        let key = batch_key();
        let read: Vec<(Vec<u8>, i64)> = values.iter().flat_map(|v| changelog_entries(Some(&key), Some(v))).collect();
        let wanted: Vec<(Vec<u8>, i64)> = entries().map(|(k, at)| (k.to_vec(), at)).collect();
        assert_eq!(read, wanted);
        assert_ne!(batch_key(), key, "batch keys are unique");
    }

    #[test]
    fn a_huge_key_gets_its_own_batch_and_a_truncated_one_yields_what_it_has() {
        let huge = vec![7u8; MAX_BATCH_BYTES + 10];
        let values = encode([(&b"a"[..], 1), (&huge[..], 2), (&b"b"[..], 3)]);
        assert_eq!(values.len(), 3);
        let key = batch_key();
        assert_eq!(changelog_entries(Some(&key), Some(&values[1])), vec![(huge.clone(), 2)]);
        let mut two = encode([(&b"a"[..], 1), (&b"bb"[..], 2)]).remove(0);
        two.truncate(two.len() - 3);
        assert_eq!(changelog_entries(Some(&key), Some(&two)), vec![(b"a".to_vec(), 1)]);
        assert!(changelog_entries(Some(&key), Some(&[9, 0, 0])).is_empty(), "unknown version");
        assert!(changelog_entries(None, Some(&[0; 8])).is_empty(), "no key");
    }
}

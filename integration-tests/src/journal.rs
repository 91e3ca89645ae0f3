//! The journal a `millrace-it-worker` writes (one line per record its processor handled) and the
//! delivery invariants checked on it.

use anyhow::{Context as _, Result, bail};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// One line of a worker's journal: a record the processor handled (its effect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key.
    pub key: String,
    /// Assignment epoch the record was processed under.
    pub epoch: u64,
    /// The idempotency key the processor saw (`-` when dedup was off).
    pub idempotency_key: String,
}

/// Reads a journal file written by `millrace-it-worker` (missing file = empty). A torn last line
/// (the writer was killed mid-write) is ignored.
pub fn read_journal(path: &Path) -> Result<Vec<JournalEntry>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            Some(JournalEntry {
                partition: f.next()?.parse().ok()?,
                offset: f.next()?.parse().ok()?,
                key: f.next()?.to_owned(),
                epoch: f.next()?.parse().ok()?,
                idempotency_key: f.next().unwrap_or("-").to_owned(),
            })
        })
        .collect())
}

/// Distinct `(partition, offset)` pairs of a journal.
pub fn distinct(entries: &[JournalEntry]) -> BTreeSet<(i32, i64)> {
    entries.iter().map(|e| (e.partition, e.offset)).collect()
}

/// For each partition, the first offset (from 0) that is not in `seen`: the end of the processed prefix.
pub fn processed_prefix(seen: &BTreeSet<(i32, i64)>, partitions: i32) -> BTreeMap<i32, i64> {
    (0..partitions)
        .map(|p| {
            let mut next = 0;
            while seen.contains(&(p, next)) {
                next += 1;
            }
            (p, next)
        })
        .collect()
}

/// Checks I2 on a snapshot: no committed offset passes a record that was not processed. Returns how many
/// records the commits cover.
pub fn assert_commits_cover_only_processed(
    committed: &BTreeMap<i32, i64>,
    seen: &BTreeSet<(i32, i64)>,
    partitions: i32,
) -> Result<i64> {
    let prefix = processed_prefix(seen, partitions);
    let mut covered = 0;
    for (p, c) in committed {
        if *c > prefix[p] {
            bail!("partition {p}: committed offset {c} passes unprocessed offset {}", prefix[p]);
        }
        covered += c;
    }
    Ok(covered)
}

/// Per key, the offsets in the order the processor saw them must strictly increase (I3). `group_by`
/// picks what one ordered stream is (e.g. per key, or per key and owner epoch).
pub fn assert_key_order<G: std::hash::Hash + Eq + std::fmt::Debug>(
    entries: &[JournalEntry],
    group_by: impl Fn(&JournalEntry) -> G,
) -> Result<()> {
    let mut last: HashMap<G, i64> = HashMap::new();
    for e in entries {
        let g = group_by(e);
        if let Some(prev) = last.get(&g)
            && *prev >= e.offset
        {
            bail!("order broken for {g:?}: offset {} handled after {prev}", e.offset);
        }
        last.insert(g, e.offset);
    }
    Ok(())
}

//! Key parking survives a SIGKILL: the worker (`--park-keys`) parks key K behind its poison record,
//! is killed once the group committed to the end, and the restarted worker still holds K: a new K
//! record is dead-lettered as `parked` behind the same record and never journaled, while another
//! key's new record runs.

use anyhow::Result;
use millrace::dlq::{DlqErrorKind, DlqInfo, headers};
use millrace_integration_tests::*;
use std::time::Duration;

type Raw = (Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Vec<u8>)>);

fn record(key: &str, value: &str) -> Raw {
    (Some(key.as_bytes().to_vec()), Some(value.as_bytes().to_vec()), Vec::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_key_stays_parked_after_sigkill() -> Result<()> {
    init_logs();
    let topic = unique("parking-kill");
    let (group, journal, dlq) = (unique("parking-kill-group"), journal_path("parking-kill"), format!("{topic}.dlq"));
    create_topic(&topic, 1).await?;
    // K at offsets 0-9 (5 is poison), other keys at 10-19.
    let ks = (0..10).map(|i| record("K", if i == 5 { "poison" } else { "v" }));
    produce_raw(&topic, ks.chain((10..20).map(|i| record(&format!("other-{}", i % 3), "v")))).await?;
    let worker = || {
        worker_command(env!("CARGO_BIN_EXE_millrace-it-worker"), &topic, &group, &journal)
            .args(["--park-keys", "--commit-interval-ms", "200", "--consumer-prop", "session.timeout.ms=6000"])
            .spawn()
    };
    let mut child = worker()?;
    committed_to_end(&group, &topic, 1, Duration::from_secs(60)).await?;
    signal(&child, libc::SIGKILL)?;
    wait_exit(&mut child, Duration::from_secs(10)).await?;
    let k_offsets = |entries: &[JournalEntry]| {
        let mut o: Vec<i64> = entries.iter().filter(|e| e.key == "K").map(|e| e.offset).collect();
        o.sort();
        o.dedup();
        o
    };
    assert_eq!(
        k_offsets(&read_journal(&journal)?),
        (0..=5).collect::<Vec<_>>(),
        "K stopped at its poison record (journaled, then failed)"
    );

    let mut child = worker()?;
    produce_raw(&topic, [record("K", "after the kill"), record("other-0", "after the kill")]).await?;
    committed_to_end(&group, &topic, 1, Duration::from_secs(60)).await?;
    signal(&child, libc::SIGTERM)?;
    assert!(wait_exit(&mut child, Duration::from_secs(30)).await?.success());

    let entries = read_journal(&journal)?;
    assert_eq!(k_offsets(&entries), (0..=5).collect::<Vec<_>>(), "nothing of K ran after the restart");
    assert!(entries.iter().any(|e| e.offset == 21), "the other key's new record ran: {entries:?}");
    let dead = read_topic(&dlq)?;
    let seen: Vec<(DlqErrorKind, i64)> = dead
        .iter()
        .map(|r| DlqInfo::from_headers(&r.headers).expect("millrace headers"))
        .map(|i| (i.kind, i.original_offset))
        .collect();
    let mut want = vec![(DlqErrorKind::Permanent, 5)];
    want.extend([6, 7, 8, 9, 20].map(|o| (DlqErrorKind::Parked, o)));
    assert_eq!(seen, want, "K's records behind the poison one, in order, the one after the kill included");
    let by = format!("{topic}/0/5");
    assert_eq!(dead.last().and_then(|r| r.headers.get(headers::PARKED_BY)), Some(by.as_bytes()));
    std::fs::remove_file(&journal).ok();
    Ok(())
}

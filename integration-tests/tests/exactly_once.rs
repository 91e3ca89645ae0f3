//! Exactly-once read-process-write (Kafka transactions), against the real broker.
//!
//! The copier (`millrace-it-worker --output-topic … --exactly-once`) runs as a child process so it
//! can be SIGKILLed and SIGSTOPped. Every input value is unique (`id-N`, or `poison-N` for records
//! the copier rejects, which go to the DLQ); the copier writes `<partition> <offset> <value>` with
//! the input's key. The checker reads the output (and the DLQ) back as a `read_committed` consumer,
//! independently of the copier, and counts each input id.

use anyhow::{Result, ensure};
use millrace::{Bounds, Context, ExactlyOnce, OutputRecord, Pipeline, PipelineConfig, ProcessError, Processor, Record};
use millrace_integration_tests::*;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_millrace-it-worker");
const INPUT_PARTITIONS: i32 = 4;
const OUTPUT_PARTITIONS: i32 = 3;

/// Input records: unique values `id-N` (every `poison_every`-th is `poison-N`), 1,000 keys.
fn inputs(n: usize, poison_every: usize) -> impl Iterator<Item = (String, Vec<u8>)> {
    (0..n).map(move |i| {
        let value = if poison_every > 0 && i % poison_every == poison_every - 1 { "poison" } else { "id" };
        (format!("k{}", i % 1_000), format!("{value}-{i}").into_bytes())
    })
}

/// What a read of the output found.
#[derive(Debug, Default)]
struct Tally {
    /// Times each input value was seen.
    seen: HashMap<String, u32>,
    /// Per key: the input (partition, offset) of each output, in output order.
    by_key: HashMap<Vec<u8>, Vec<(i32, i64)>>,
}

impl Tally {
    fn add(&mut self, records: &[ReadRecord]) {
        for r in records {
            let text = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
            let mut parts = text.splitn(3, ' ');
            let (p, o, value) = (parts.next(), parts.next(), parts.next());
            let (Some(p), Some(o), Some(value)) = (p, o, value) else { panic!("unexpected output {text:?}") };
            *self.seen.entry(value.to_owned()).or_default() += 1;
            let key = r.key.clone().unwrap_or_default();
            self.by_key.entry(key).or_default().push((p.parse().unwrap(), o.parse().unwrap()));
        }
    }

    fn duplicates(&self) -> usize {
        self.seen.values().map(|&n| n as usize - 1).sum()
    }

    /// Same key → same input partition, so its outputs must carry increasing input offsets.
    fn assert_key_order(&self) {
        for (key, inputs) in &self.by_key {
            for w in inputs.windows(2) {
                assert!(
                    w[0].0 == w[1].0 && w[0].1 < w[1].1,
                    "key {:?}: output order {:?} then {:?} does not follow input order",
                    String::from_utf8_lossy(key),
                    w[0],
                    w[1]
                );
            }
        }
    }
}

/// Reads a whole topic as `read_committed`, output-shaped records only.
fn tally_committed(topic: &str) -> Result<Tally> {
    let mut t = Tally::default();
    t.add(&read_topic_as(topic, Isolation::ReadCommitted)?);
    Ok(t)
}

/// A `read_committed` reader running beside the copier, counting what it sees.
struct ConcurrentReader {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<Tally>>,
}

impl ConcurrentReader {
    fn start(topic: &str) -> Result<Self> {
        let reader = TopicReader::new(topic, Isolation::ReadCommitted)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut tally = Tally::default();
            while !stop2.load(Relaxed) {
                tally.add(&reader.poll(Duration::from_millis(100))?.0);
            }
            Ok(tally)
        });
        Ok(Self { stop, thread })
    }

    fn finish(self) -> Result<Tally> {
        self.stop.store(true, Relaxed);
        self.thread.join().expect("reader thread")
    }
}

struct Copier<'a> {
    input: &'a str,
    output: &'a str,
    group: &'a str,
    journal: &'a Path,
    extra: Vec<String>,
}

impl Copier<'_> {
    /// Starts incarnation `n`, its log (warnings, and Millrace's info lines: assignments, rewinds,
    /// transaction aborts) in a file of its own, so a test that times out can say what the copier did.
    fn spawn(&self, n: usize) -> Result<Reaped> {
        let log = std::fs::File::create(self.log(n))?;
        Ok(Reaped(
            worker_command(WORKER, self.input, self.group, self.journal)
                .args(["--output-topic", self.output, "--delay-max-ms", "2", "--concurrency", "64"])
                .args(&self.extra)
                .env("RUST_LOG", "warn,millrace=info,librdkafka=error")
                .stderr(log)
                .spawn()?,
        ))
    }

    fn log(&self, n: usize) -> std::path::PathBuf {
        self.journal.with_extension(format!("log{n}"))
    }

    /// Adds the last lines of incarnation `n`'s log to a failure.
    fn explain(&self, n: usize, e: anyhow::Error) -> anyhow::Error {
        let text = std::fs::read_to_string(self.log(n)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        e.context(format!("copier incarnation {n}; the last lines of its log ({}):\n{tail}", self.log(n).display()))
    }
}

/// How a kill test went.
struct KillRun {
    kills: usize,
    kills_in_open_transaction: usize,
    final_tally: Tally,
    concurrent: Tally,
    dlq: Tally,
}

/// Copies `n` records while SIGKILLing the copier `kills` times at random points; with
/// `kill_in_transaction`, one kill waits until a transaction is visibly open (the output's
/// read_uncommitted end ahead of its read_committed end). Runs to completion and stops the copier.
async fn copier_under_kills(name: &str, n: usize, kills: usize, exactly_once: bool) -> Result<KillRun> {
    init_logs();
    let input = unique(&format!("{name}-in"));
    let output = unique(&format!("{name}-out"));
    let group = unique(&format!("{name}-group"));
    let journal = journal_path(name);
    create_topic(&input, INPUT_PARTITIONS).await?;
    create_topic(&output, OUTPUT_PARTITIONS).await?;
    create_topic(&format!("{input}.dlq"), INPUT_PARTITIONS).await?;
    produce(&input, inputs(n, 2_000)).await?;
    let transactional_id = format!("{group}-copier");
    let mut extra: Vec<String> = [
        // Static membership: the restarted copier takes its partitions back without waiting for
        // the killed one's session to expire.
        "--consumer-prop",
        &format!("group.instance.id={group}-1"),
        "--consumer-prop",
        "session.timeout.ms=10000",
        "--commit-interval-ms",
        "1000",
    ]
    .map(String::from)
    .to_vec();
    if exactly_once {
        extra.extend(["--exactly-once", "--transactional-id", &transactional_id].map(String::from));
    }
    let copier = Copier { input: &input, output: &output, group: &group, journal: &journal, extra };
    let reader = ConcurrentReader::start(&output)?;
    let committed_view = Watermarks::new(Isolation::ReadCommitted)?;
    let uncommitted_view = Watermarks::new(Isolation::ReadUncommitted)?;
    // Progress: the input offsets the group committed.
    let committed_total = || -> Result<i64> { Ok(committed_offsets(&group, &input, INPUT_PARTITIONS)?.values().sum()) };

    let mut child = copier.spawn(0)?;
    let mut kills_in_open_transaction = 0;
    for kill in 0..kills {
        // Random committed progress between kills (every incarnation commits something before it
        // dies): 2–12% of the input.
        let target = committed_total()? + (n as i64) * rand::random_range(2..=12) / 100;
        eventually("the copier to commit progress", Duration::from_secs(90), || {
            Ok((committed_total()? >= target).then_some(()))
        })
        .await
        .map_err(|e| copier.explain(kill, e))?;
        if exactly_once && kill == 1 {
            // Kill while a transaction has written outputs but not committed them: the output's
            // read_uncommitted end is ahead of its read_committed end (the last stable offset)
            // only then. The window is a few milliseconds per commit, so look often.
            let deadline = Instant::now() + Duration::from_secs(60);
            while committed_view.ends(&output, OUTPUT_PARTITIONS)?
                == uncommitted_view.ends(&output, OUTPUT_PARTITIONS)?
            {
                ensure!(Instant::now() < deadline, "no open transaction seen in 60 s");
                std::thread::sleep(Duration::from_millis(1));
            }
            kills_in_open_transaction += 1;
        }
        signal(&child, libc::SIGKILL)?;
        wait_exit(&mut child, Duration::from_secs(10)).await?;
        child = copier.spawn(kill + 1)?;
    }
    let ends = end_offsets(&input, INPUT_PARTITIONS)?;
    eventually("committed offsets to reach the input's end", Duration::from_secs(180), || {
        Ok((committed_offsets(&group, &input, INPUT_PARTITIONS)? == ends).then_some(()))
    })
    .await
    .map_err(|e| copier.explain(kills, e))?;
    signal(&child, libc::SIGTERM)?;
    ensure!(wait_exit(&mut child, Duration::from_secs(30)).await?.success(), "copier exit");
    println!("{name}: {}", worker_summary(&mut child)?.trim());

    let final_tally = tally_committed(&output)?;
    let concurrent = {
        // Let the concurrent reader catch up with the committed end before stopping it.
        let goal = final_tally.seen.values().map(|&c| c as usize).sum::<usize>();
        let reader_done = Instant::now() + Duration::from_secs(30);
        while Instant::now() < reader_done && !reader.thread.is_finished() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if goal == 0 {
                break;
            }
            if committed_view.ends(&output, OUTPUT_PARTITIONS)? == uncommitted_view.ends(&output, OUTPUT_PARTITIONS)? {
                break;
            }
        }
        reader.finish()?
    };
    if exactly_once {
        assert_eq!(
            committed_view.ends(&output, OUTPUT_PARTITIONS)?,
            uncommitted_view.ends(&output, OUTPUT_PARTITIONS)?,
            "no transaction left hanging: read_committed and read_uncommitted end offsets agree"
        );
    }
    let dlq = {
        let mut t = Tally::default();
        for r in read_topic_as(&format!("{input}.dlq"), Isolation::ReadCommitted)? {
            let value = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
            *t.seen.entry(value).or_default() += 1;
        }
        t
    };
    Ok(KillRun { kills, kills_in_open_transaction, final_tally, concurrent, dlq })
}

fn assert_exactly_once(run: &KillRun, n: usize) {
    let poison = n / 2_000;
    let expected: Vec<String> = inputs(n, 2_000).map(|(_, v)| String::from_utf8(v).unwrap()).collect();
    let missing: Vec<&String> =
        expected.iter().filter(|v| v.starts_with("id") && !run.final_tally.seen.contains_key(*v)).take(5).collect();
    assert!(missing.is_empty(), "inputs missing from the output: {missing:?}…");
    assert_eq!(run.final_tally.seen.len(), n - poison, "exactly the good inputs, nothing else");
    assert_eq!(run.final_tally.duplicates(), 0, "no duplicate for a read_committed reader after the run");
    assert_eq!(run.concurrent.duplicates(), 0, "no duplicate for the concurrent read_committed reader");
    run.final_tally.assert_key_order();
    assert_eq!(run.dlq.seen.len(), poison, "every poison record in the DLQ");
    assert_eq!(run.dlq.duplicates(), 0, "each poison record in the DLQ exactly once");
    assert!(run.dlq.seen.keys().all(|v| v.starts_with("poison-")), "only poison in the DLQ");
}

/// The acceptance test: 100,000 records copied 4 → 3 partitions in Key mode with random delays,
/// SIGKILLed 5 times (once with a transaction open), restarted each time; poison records go to
/// the DLQ in the same transactions. A read_committed reader finds every input exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copier_killed_five_times_outputs_every_input_exactly_once() -> Result<()> {
    const N: usize = 100_000;
    let run = copier_under_kills("eos-kill", N, 5, true).await?;
    println!(
        "exactly-once: {} kills ({} with a transaction open); {} outputs, {} duplicates (final), {} seen by the concurrent reader with {} duplicates; {} in the DLQ",
        run.kills,
        run.kills_in_open_transaction,
        run.final_tally.seen.len(),
        run.final_tally.duplicates(),
        run.concurrent.seen.len(),
        run.concurrent.duplicates(),
        run.dlq.seen.len(),
    );
    assert_eq!(run.kills_in_open_transaction, 1);
    assert_exactly_once(&run, N);
    Ok(())
}

/// Negative control: the same kills in at-least-once mode produce duplicates, so the checker above
/// can see them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_control_at_least_once_copier_under_kills_duplicates() -> Result<()> {
    const N: usize = 40_000;
    let run = copier_under_kills("alos-kill", N, 3, false).await?;
    let missing =
        (0..N).filter(|i| i % 2_000 != 1_999 && !run.final_tally.seen.contains_key(&format!("id-{i}"))).count();
    println!(
        "at-least-once control: {} kills; {} duplicate outputs, {} missing",
        run.kills,
        run.final_tally.duplicates(),
        missing
    );
    assert_eq!(missing, 0, "at-least-once still loses nothing");
    assert!(run.final_tally.duplicates() > 0, "kills between output and commit must show up as duplicates");
    Ok(())
}

/// Copies in-process, aborting ~1/3 of the transactions on purpose: aborted outputs never show,
/// the partitions are rewound and redone, and the result is still exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_aborts_are_rewound_and_the_result_stays_exactly_once() -> Result<()> {
    init_logs();
    const N: usize = 20_000;
    let input = unique("eos-abort-in");
    let output = unique("eos-abort-out");
    let group = unique("eos-abort-group");
    create_topic(&input, INPUT_PARTITIONS).await?;
    create_topic(&output, OUTPUT_PARTITIONS).await?;
    produce(&input, inputs(N, 0)).await?;

    struct Copy(String);
    impl Processor for Copy {
        async fn process(&self, record: &Record, ctx: &Context) -> Result<(), ProcessError> {
            // Slow enough (with 8 at a time) to spread the input over dozens of transactions.
            tokio::time::sleep(Duration::from_millis(1)).await;
            let mut value = format!("{} {} ", record.partition, record.offset).into_bytes();
            value.extend_from_slice(record.value.as_deref().unwrap_or_default());
            let mut out = OutputRecord::to(&self.0).value(value);
            out.key = record.key.clone();
            ctx.emit(out).await?;
            Ok(())
        }
    }
    let config = PipelineConfig::new(bootstrap(), &group, [&input])
        .exactly_once(ExactlyOnce::default().transactional_id(format!("{group}-tx")).inject_abort_ratio(1.0 / 3.0))
        .commit_interval(Duration::from_millis(30))
        .bounds(Bounds { max_concurrency: 8, ..Bounds::default() });
    let pipeline = Pipeline::new(config, Copy(output.clone()))?;
    let (stats, stop) = (pipeline.stats(), pipeline.shutdown_token());
    let run = tokio::spawn(pipeline.run());
    let ends = end_offsets(&input, INPUT_PARTITIONS)?;
    eventually("committed offsets to reach the end", Duration::from_secs(120), || {
        Ok((committed_offsets(&group, &input, INPUT_PARTITIONS)? == ends).then_some(()))
    })
    .await?;
    stop.cancel();
    run.await??;
    let s = stats.snapshot();
    let tally = tally_committed(&output)?;
    println!(
        "aborts: {} committed, {} aborted ({} injected), {} partition rewinds; {} outputs, {} duplicates; {} processed for {N} inputs",
        s.transactions_committed,
        s.transactions_aborted,
        s.transactions_injected_aborts,
        s.rewinds,
        tally.seen.len(),
        tally.duplicates(),
        s.processed
    );
    assert!(s.transactions_injected_aborts >= 3, "aborts were injected");
    assert!(s.rewinds >= s.transactions_injected_aborts, "every aborted transaction rewound its partitions");
    assert!(s.processed > N as u64, "aborted work was redone");
    assert_eq!(tally.seen.len(), N, "every input in the output");
    assert_eq!(tally.duplicates(), 0, "aborted outputs are invisible to read_committed readers");
    tally.assert_key_order();
    let committed_view = Watermarks::new(Isolation::ReadCommitted)?;
    let uncommitted_view = Watermarks::new(Isolation::ReadUncommitted)?;
    assert_eq!(committed_view.ends(&output, OUTPUT_PARTITIONS)?, uncommitted_view.ends(&output, OUTPUT_PARTITIONS)?);
    Ok(())
}

/// Zombie fencing: of two copiers, one is SIGSTOPped past its session timeout; the other takes its
/// partitions over; the stopped one is resumed and must not commit output for partitions that
/// moved. The output holds every input exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_zombie_cannot_commit_for_partitions_that_moved() -> Result<()> {
    init_logs();
    const N: usize = 30_000;
    let input = unique("eos-zombie-in");
    let output = unique("eos-zombie-out");
    let group = unique("eos-zombie-group");
    create_topic(&input, INPUT_PARTITIONS).await?;
    create_topic(&output, OUTPUT_PARTITIONS).await?;
    produce(&input, inputs(N, 0)).await?;
    let (journal_a, journal_b) = (journal_path("zombie-a"), journal_path("zombie-b"));
    let copier = |journal: &Path, id: &str| -> Result<Child> {
        Ok(worker_command(WORKER, &input, &group, journal)
            .args(["--output-topic", &output, "--exactly-once", "--transactional-id", id])
            // Slow enough that work remains when the zombie wakes up.
            .args(["--delay-min-ms", "5", "--delay-max-ms", "15", "--concurrency", "16"])
            .args(["--consumer-prop", "session.timeout.ms=6000", "--consumer-prop", "heartbeat.interval.ms=1000"])
            .spawn()?)
    };
    let mut a = copier(&journal_a, &format!("{group}-a"))?;
    let mut b = copier(&journal_b, &format!("{group}-b"))?;
    // Both own partitions and process: A's partitions are those it processed lately, none of which
    // B processed in the same while (the initial rebalances are over).
    let mut since = (0, 0);
    let owned_by_a = eventually("both copiers processing distinct partitions", Duration::from_secs(60), || {
        let (ja, jb) = (read_journal(&journal_a)?, read_journal(&journal_b)?);
        let recent = |j: &[JournalEntry], from: usize| {
            j[from.min(j.len())..].iter().map(|e| e.partition).collect::<BTreeSet<_>>()
        };
        let (pa, pb) = (recent(&ja, since.0), recent(&jb, since.1));
        let enough = ja.len() >= since.0 + 100 && jb.len() >= since.1 + 100;
        if enough && pa.is_disjoint(&pb) {
            return Ok(Some(pa));
        }
        if enough {
            since = (ja.len(), jb.len());
        }
        Ok(None)
    })
    .await?;
    signal(&a, libc::SIGSTOP)?;
    let stopped_at = Instant::now();
    // B takes A's partitions over once A's session expired.
    let journal_b_len = read_journal(&journal_b)?.len();
    eventually("the other copier to take the stopped one's partitions", Duration::from_secs(60), || {
        let took_over = read_journal(&journal_b)?.iter().skip(journal_b_len).any(|e| owned_by_a.contains(&e.partition));
        Ok(took_over.then_some(()))
    })
    .await?;
    println!("takeover {:?} after SIGSTOP", stopped_at.elapsed());
    signal(&a, libc::SIGCONT)?;
    let ends = end_offsets(&input, INPUT_PARTITIONS)?;
    eventually("committed offsets to reach the input's end", Duration::from_secs(180), || {
        Ok((committed_offsets(&group, &input, INPUT_PARTITIONS)? == ends).then_some(()))
    })
    .await?;
    for child in [&mut a, &mut b] {
        signal(child, libc::SIGTERM)?;
        let status = wait_exit(child, Duration::from_secs(30)).await?;
        println!("copier exited {status}: {}", worker_summary(child)?.trim());
    }
    let tally = tally_committed(&output)?;
    println!("zombie: {} outputs, {} duplicates", tally.seen.len(), tally.duplicates());
    assert_eq!(tally.seen.len(), N, "every input in the output");
    assert_eq!(tally.duplicates(), 0, "the zombie committed nothing for partitions that moved");
    tally.assert_key_order();
    Ok(())
}

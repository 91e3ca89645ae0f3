//! `millrace-chaos`: the chaos suite. Each scenario runs `millrace-it-worker` pipelines as child
//! processes against a real broker, injects faults (SIGKILL, SIGTERM, SIGSTOP, rebalances, broker
//! restarts, injected transaction aborts, poison records), and then checks the delivery contract with
//! a checker that shares nothing with the pipeline: it reads Kafka back as `read_committed` (and
//! alongside the run, concurrently) and reads the journals and ledgers the worker writes outside
//! Kafka. One summary line per scenario:
//!
//! ```text
//! scenario=copier-sigkill records=40000 faults=213 (kills=10 rebalances=0 broker_restarts=0 aborts=203) lost=0 duplicated=0 result=PASS
//! ```
//!
//! Run it with `scripts/chaos [--profile ci|long] [--seed N] [--scenario NAME]`. The seed is printed
//! at the start; the same seed replays the harness's choices (which records are poison or
//! duplicated, kill points, storm toggles and their timing), though not the machine's timing.
//!
//! Modules: [`profile`] (sizes per profile), [`fleet`] (worker processes), [`check`] (the independent
//! checkers), [`broker`] (restarting the broker `scripts/kafka` owns), [`outcome`] (the summary
//! line), and one module per scenario family: [`copier`], [`side_effects`], [`dedup_eos`],
//! [`storm`], [`broker_restart`], [`poison`].

mod broker;
mod broker_restart;
mod check;
mod copier;
mod dedup_eos;
mod fleet;
mod outcome;
mod parking;
mod poison;
mod profile;
mod side_effects;
mod storm;

use anyhow::{Result, bail};
use clap::Parser;
use outcome::Outcome;
use profile::Profile;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::path::PathBuf;
use std::time::Instant;

/// The scenarios in the order the suite runs them. The broker restarts come last: they restart
/// the broker everything else uses.
const SCENARIOS: [&str; 9] = [
    "copier-sigkill",
    "side-effects-sigkill",
    "dedup-eos-sigkill",
    "rebalance-storm-eos",
    "rebalance-storm-alos",
    "poison",
    "parked-keys",
    "negative-control",
    "broker-restart",
];

#[derive(Parser, Debug)]
#[command(about = "Millrace's chaos suite: faults injected into real pipelines, invariants checked independently")]
struct Args {
    /// `ci` (a few minutes) or `long`.
    #[arg(long, default_value = "ci")]
    profile: String,
    /// Seed of every random choice the harness makes; random when unset (and printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Run only this scenario (repeatable).
    #[arg(long)]
    scenario: Vec<String>,
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// Fail on known framework bugs too (by default they print `result=KNOWN-FAIL` and do not fail
    /// the suite).
    #[arg(long)]
    strict: bool,
    /// The broker at `KAFKA_BOOTSTRAP_SERVERS` was started for this run (by `scripts/kafka` with this
    /// environment) and `broker-restart` may kill and restart it; without this flag that scenario is
    /// skipped, so that a shared broker is never restarted by accident.
    #[arg(long)]
    own_broker: bool,
    /// Keep the run directory (journals, ledgers, worker logs) even when every scenario passes.
    #[arg(long)]
    keep: bool,
}

/// What every scenario gets: the worker binary, a directory for its files, the profile and a seeded
/// random generator of its own (so one scenario replays alone with the suite's seed).
pub struct Env {
    /// `millrace-it-worker`.
    pub worker: PathBuf,
    /// This scenario's directory for journals, ledgers, stats and logs.
    pub dir: PathBuf,
    /// Sizes.
    pub profile: Profile,
    /// The suite's seed.
    pub seed: u64,
    /// This scenario's generator.
    pub rng: StdRng,
    /// Whether the broker may be restarted (`--own-broker`).
    pub own_broker: bool,
}

fn scenario_seed(seed: u64, name: &str) -> u64 {
    // FNV-1a of the name, mixed into the suite seed: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    seed ^ h
}

async fn run_scenario(name: &str, env: Env) -> Result<Outcome> {
    match name {
        "copier-sigkill" => copier::copier_sigkill(env).await,
        "negative-control" => copier::negative_control(env).await,
        "side-effects-sigkill" => side_effects::run(env).await,
        "dedup-eos-sigkill" => dedup_eos::run(env).await,
        "rebalance-storm-eos" => storm::run(env, true).await,
        "rebalance-storm-alos" => storm::run(env, false).await,
        "broker-restart" => broker_restart::run(env).await,
        "poison" => poison::run(env).await,
        "parked-keys" => parking::run(env).await,
        other => bail!("unknown scenario {other:?}; --list shows them"),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.list {
        for s in SCENARIOS {
            println!("{s}");
        }
        return Ok(());
    }
    let profile = Profile::named(&args.profile)?;
    let seed = args.seed.unwrap_or_else(rand::random);
    let chosen: Vec<String> =
        if args.scenario.is_empty() { SCENARIOS.map(String::from).to_vec() } else { args.scenario.clone() };
    for s in &chosen {
        if !SCENARIOS.contains(&s.as_str()) {
            bail!("unknown scenario {s:?}; --list shows them");
        }
    }
    let worker = std::env::current_exe()?.with_file_name("millrace-it-worker");
    if !worker.exists() {
        bail!("{} not found: build it with `cargo build -p millrace-integration-tests --bins`", worker.display());
    }
    let run_dir = std::env::temp_dir().join(format!("millrace-chaos-{seed}-{}", std::process::id()));
    std::fs::create_dir_all(&run_dir)?;
    println!(
        "chaos: profile={} seed={seed} brokers={} scenarios={} dir={}",
        args.profile,
        millrace_integration_tests::bootstrap(),
        chosen.join(","),
        run_dir.display()
    );
    println!("chaos: replay with `scripts/chaos --profile {} --seed {seed}`", args.profile);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for name in &chosen {
        let dir = run_dir.join(name);
        std::fs::create_dir_all(&dir)?;
        let env = Env {
            worker: worker.clone(),
            dir,
            profile: profile.clone(),
            seed,
            rng: StdRng::seed_from_u64(scenario_seed(seed, name)),
            own_broker: args.own_broker,
        };
        let t0 = Instant::now();
        let outcome = match runtime.block_on(run_scenario(name, env)) {
            Ok(o) => o,
            Err(e) => Outcome::errored(name, format!("{e:#}")),
        };
        outcome.print(t0.elapsed());
        outcomes.push(outcome);
    }
    let failed: Vec<&str> = outcomes.iter().filter(|o| !o.passed(args.strict)).map(|o| o.scenario.as_str()).collect();
    let known: Vec<&str> = outcomes.iter().filter(|o| !o.known.is_empty()).map(|o| o.scenario.as_str()).collect();
    let skipped: Vec<&str> = outcomes.iter().filter(|o| o.skipped.is_some()).map(|o| o.scenario.as_str()).collect();
    let totals = outcome::Totals::of(&outcomes);
    println!(
        "chaos: total records={} kills={} rebalances={} broker_restarts={} aborts={} lost={} duplicated={} in {:.0}s seed={seed}: {}",
        totals.records,
        totals.kills,
        totals.rebalances,
        totals.broker_restarts,
        totals.aborts,
        totals.lost,
        totals.duplicated,
        started.elapsed().as_secs_f64(),
        match (failed.is_empty(), skipped.is_empty()) {
            (false, _) => format!("FAIL ({})", failed.join(", ")),
            (true, true) => "PASS".to_owned(),
            (true, false) => format!("PASS (skipped: {})", skipped.join(", ")),
        }
    );
    if !known.is_empty() {
        println!(
            "chaos: known framework bugs showed in: {} (see RELIABILITY.md; --strict fails on them)",
            known.join(", ")
        );
    }
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    if failed.is_empty() && known.is_empty() && !args.keep {
        let _ = std::fs::remove_dir_all(&run_dir);
    } else {
        println!("chaos: journals, ledgers and worker logs kept in {}", run_dir.display());
    }
    if !failed.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

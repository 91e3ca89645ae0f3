//! Process signals: the first SIGINT or SIGTERM starts a graceful shutdown; a second one exits at once.

use tokio_util::sync::CancellationToken;

/// Exit status used when a second signal aborts the graceful shutdown (128 + SIGINT).
pub const FORCED_EXIT_CODE: i32 = 130;

/// Spawns a task that cancels `token` on the first SIGINT or SIGTERM and exits the process with
/// [`FORCED_EXIT_CODE`] on the second. Nothing is committed by the forced exit, so unfinished work is
/// redelivered after a restart. Must be called inside a Tokio runtime.
pub fn on_signals(token: CancellationToken) {
    tokio::spawn(async move {
        if wait_for_signal().await.is_err() {
            tracing::warn!("cannot listen for signals; stop the pipeline with its shutdown token");
            return;
        }
        tracing::info!("signal received: shutting down gracefully (send another to exit at once)");
        token.cancel();
        let _ = wait_for_signal().await;
        tracing::warn!("second signal: exiting without draining");
        std::process::exit(FORCED_EXIT_CODE);
    });
}

/// Resolves on the first SIGINT or SIGTERM (Ctrl-C where there are no Unix signals); an error when
/// the signals cannot be listened for. Tools that stop in their own way (the `millrace` CLI's
/// replay) wait on this instead of [`on_signals`].
#[cfg(unix)]
pub async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
pub async fn wait_for_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}

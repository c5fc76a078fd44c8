//! Restore progress: a bar on a terminal, log lines otherwise.

use std::time::Instant;

/// Restore progress over bytes fetched and applied: a bar (bytes, rate, ETA) when stderr is a
/// terminal, otherwise an INFO log line every few seconds.
#[derive(Clone)]
pub(super) struct Progress {
    inner: std::sync::Arc<ProgressInner>,
}

struct ProgressInner {
    done: std::sync::atomic::AtomicU64,
    total: u64,
    bar: Option<indicatif::ProgressBar>,
    stop: tokio_util::sync::CancellationToken,
}

/// Interval of progress log lines when no terminal is attached.
const PROGRESS_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Progress {
    pub(super) fn start(total: u64) -> Progress {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "restore [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        });
        let inner = std::sync::Arc::new(ProgressInner {
            done: std::sync::atomic::AtomicU64::new(0),
            total,
            bar,
            stop: tokio_util::sync::CancellationToken::new(),
        });
        if inner.bar.is_none() {
            let me = inner.clone();
            let started = Instant::now();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = me.stop.cancelled() => return,
                        _ = tokio::time::sleep(PROGRESS_LOG_EVERY) => {}
                    }
                    let done = me.done.load(std::sync::atomic::Ordering::Relaxed);
                    let rate = done as f64 / started.elapsed().as_secs_f64().max(0.001) / 1e6;
                    tracing::info!(
                        done_bytes = done,
                        total_bytes = me.total,
                        mb_per_s = format!("{rate:.1}"),
                        "restore progress"
                    );
                }
            });
        }
        Progress { inner }
    }

    pub(super) fn add(&self, n: u64) {
        self.inner
            .done
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        if let Some(bar) = &self.inner.bar {
            bar.inc(n);
        }
    }

    pub(super) fn finish(&self) {
        self.inner.stop.cancel();
        if let Some(bar) = &self.inner.bar {
            bar.finish_and_clear();
        }
    }
}

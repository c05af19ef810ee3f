//! Process signals a service reacts to, behind one seam so the simulation stays
//! deterministic: under madsim no signal ever arrives.

/// A stream of SIGHUPs (the operator's "re-read your credentials").
pub struct Hangups {
    #[cfg(all(unix, not(madsim)))]
    inner: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    /// Starts listening. If the platform cannot deliver SIGHUP, [`Hangups::next`] never
    /// resolves.
    pub fn new() -> Hangups {
        #[cfg(all(unix, not(madsim)))]
        {
            let inner = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            Hangups { inner }
        }
        #[cfg(not(all(unix, not(madsim))))]
        Hangups {}
    }

    /// Resolves at the next SIGHUP (never under madsim).
    pub async fn next(&mut self) {
        #[cfg(all(unix, not(madsim)))]
        if let Some(s) = self.inner.as_mut() {
            if s.recv().await.is_some() {
                return;
            }
        }
        std::future::pending::<()>().await
    }
}

impl Default for Hangups {
    fn default() -> Self {
        Hangups::new()
    }
}

//! The client side of authentication (C3-extensions E-13): where a request's
//! `Authorization: Bearer <token>` comes from.
//!
//! A [`Bearer`] is attached to an [`super::HttpClient`] once; the client adds the header in
//! one place (`send`), after the simulation's wire log has recorded the request, so a token
//! never reaches a log. A token read from a file ([`Bearer::file`]) is re-read whenever the
//! file's length or modification time changes, so a client follows a rotation without a
//! restart.
//!
//! Invariant: no `Debug`/`Display` of anything here shows a token.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use dlock_contract::auth::Secret;

/// Longest token file a client reads (bytes).
pub const TOKEN_FILE_BYTES_MAX: u64 = 4_096;

/// Chooses the token for one request.
pub trait BearerSource: Send + Sync + std::fmt::Debug {
    /// The token to present for `method path`, if any.
    fn token(&self, method: &http::Method, path: &str) -> Option<Secret>;
}

/// A shareable token source.
#[derive(Clone, Debug)]
pub struct Bearer(Arc<dyn BearerSource>);

impl Bearer {
    /// Always `token`.
    pub fn fixed(token: Secret) -> Bearer {
        Bearer(Arc::new(Fixed(token)))
    }

    /// The token in `path` (its first non-blank, non-`#` line, trimmed), re-read when the
    /// file changes. Fails when the file cannot be read or holds no token.
    pub fn file(path: &Path) -> Result<Bearer, String> {
        let f = FileToken { path: path.to_owned(), cache: Mutex::new(None) };
        f.current()?;
        Ok(Bearer(Arc::new(f)))
    }

    /// Any source.
    pub fn from_source(source: Arc<dyn BearerSource>) -> Bearer {
        Bearer(source)
    }

    /// From a client's two keys: the file wins over the inline token; neither: `None`.
    pub fn from_keys(inline: Option<String>, file: Option<PathBuf>) -> Result<Option<Bearer>, String> {
        match (file, inline) {
            (Some(path), _) => Bearer::file(&path).map(Some),
            (None, Some(t)) if !t.trim().is_empty() => Ok(Some(Bearer::fixed(Secret::new(t.trim())))),
            (None, _) => Ok(None),
        }
    }

    /// The `Authorization` value for `method path`.
    pub fn header_value(&self, method: &http::Method, path: &str) -> Option<String> {
        self.0.token(method, path).map(|t| format!("Bearer {}", t.expose()))
    }
}

#[derive(Debug)]
struct Fixed(Secret);

impl BearerSource for Fixed {
    fn token(&self, _: &http::Method, _: &str) -> Option<Secret> {
        Some(self.0.clone())
    }
}

type Stamp = (Option<std::time::SystemTime>, u64);

struct FileToken {
    path: PathBuf,
    cache: Mutex<Option<(Stamp, Secret)>>,
}

impl std::fmt::Debug for FileToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileToken").field("path", &self.path).field("token", &"***").finish()
    }
}

fn read_token(path: &Path) -> Result<(Stamp, Secret), String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read the token file {shown}: {e}"))?;
    if meta.len() > TOKEN_FILE_BYTES_MAX {
        return Err(format!("the token file {shown} is larger than {TOKEN_FILE_BYTES_MAX} bytes"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read the token file {shown}: {e}"))?;
    let token = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .ok_or_else(|| format!("the token file {shown} holds no token"))?;
    Ok(((meta.modified().ok(), meta.len()), Secret::new(token)))
}

impl FileToken {
    fn current(&self) -> Result<Secret, String> {
        let stamp: Option<Stamp> = std::fs::metadata(&self.path).ok().map(|m| (m.modified().ok(), m.len()));
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some((seen, token)), Some(now)) = (cache.as_ref(), stamp) {
            if *seen == now {
                return Ok(token.clone());
            }
        }
        match read_token(&self.path) {
            Ok((stamp, token)) => {
                *cache = Some((stamp, token.clone()));
                Ok(token)
            }
            // A file being replaced may be briefly absent or empty: keep the last token.
            Err(e) => cache.as_ref().map(|(_, t)| t.clone()).ok_or(e),
        }
    }
}

impl BearerSource for FileToken {
    fn token(&self, _: &http::Method, _: &str) -> Option<Secret> {
        match self.current() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "token_file_unreadable");
                None
            }
        }
    }
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;

    #[test]
    fn a_file_token_follows_the_file_and_never_shows_in_debug() {
        let dir = std::env::temp_dir().join(format!("dlock-bearer-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("token");
        std::fs::write(&path, "# mine\nfirst-token-0123456789\n").expect("write");
        let b = Bearer::file(&path).expect("bearer");
        assert_eq!(b.header_value(&http::Method::GET, "/").as_deref(), Some("Bearer first-token-0123456789"));
        std::fs::write(&path, "second-token-0123456789-longer\n").expect("rewrite");
        assert_eq!(b.header_value(&http::Method::GET, "/").as_deref(), Some("Bearer second-token-0123456789-longer"));
        let shown = format!("{b:?}");
        assert!(!shown.contains("token-0123") && shown.contains("***"), "{shown}");
        assert!(Bearer::file(&dir.join("absent")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

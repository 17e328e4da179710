//! Files a definition names, and problems found in files, as every command reports them.

use std::path::{Path, PathBuf};

/// A problem in one file: `FILE: WHERE: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// The file.
    pub file: String,
    /// A JSON pointer (`/states/0/name`), `/` for the whole document, or `line N`.
    pub place: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.file, self.place, self.message)
    }
}

/// A problem at `place` in `file`.
pub fn ferr(file: &Path, place: impl Into<String>, message: impl Into<String>) -> FileError {
    FileError {
        file: file.display().to_string(),
        place: place.into(),
        message: message.into(),
    }
}

/// Resolves a URI found in a definition to a local file: `file://` and plain paths are relative
/// to the definition's folder.
pub fn resolve_uri(dir: &Path, uri: &str) -> Result<PathBuf, String> {
    let path = if let Some(rest) = uri.strip_prefix("file://") {
        rest
    } else if uri.contains("://") {
        return Err(format!(
            "{uri:?} is remote; only local files (file:// or a relative path) can be read"
        ));
    } else {
        uri
    };
    let path = path.split('#').next().unwrap_or(path);
    let p = Path::new(path);
    Ok(if p.is_absolute() { p.to_path_buf() } else { dir.join(p) })
}

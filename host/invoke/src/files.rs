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

/// The largest local file a definition may name (an OpenAPI document, a `.proto`, a referenced
/// events, functions or retries file): 16 MiB.
pub const MAX_FILE: u64 = 16 << 20;

/// Resolves a URI found in a definition to a local file: `file://` and plain paths are relative
/// to the definition's folder `dir`, and the file must be inside it (see [`resolve_in`]).
pub fn resolve_uri(dir: &Path, uri: &str) -> Result<PathBuf, String> {
    resolve_in(dir, &[dir], uri)
}

/// Resolves a URI found in a definition to a local file, relative to `dir`: the path is made
/// canonical (`..` and symbolic links resolved) and must be a regular file of at most
/// [`MAX_FILE`] bytes inside one of the `roots` folders. A path that leaves them
/// (`../../etc/passwd`, an absolute path elsewhere, a symbolic link that points out) is refused.
pub fn resolve_in(dir: &Path, roots: &[&Path], uri: &str) -> Result<PathBuf, String> {
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
    let joined = if p.is_absolute() { p.to_path_buf() } else { dir.join(p) };
    let real = joined
        .canonicalize()
        .map_err(|e| format!("cannot read {}: {e}", joined.display()))?;
    let inside = roots
        .iter()
        .filter_map(|r| r.canonicalize().ok())
        .any(|r| real.starts_with(&r));
    if !inside {
        let folders: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        return Err(format!(
            "{uri:?} is outside the folder{} files may be read from ({}): {} leaves it",
            if folders.len() == 1 { "" } else { "s" },
            folders.join(", "),
            joined.display()
        ));
    }
    let meta = std::fs::metadata(&real).map_err(|e| format!("cannot read {}: {e}", joined.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", joined.display()));
    }
    if meta.len() > MAX_FILE {
        return Err(format!(
            "{} is {} bytes, more than the {MAX_FILE} bytes a file may have",
            joined.display(),
            meta.len()
        ));
    }
    Ok(real)
}

/// The `rest` and `rpc` functions of `m` whose local OpenAPI document or `.proto` (`file://` or a
/// relative path, resolved against the definitions folder `dir`) is outside that folder, each as
/// an error at `/functions/N/operation`. A file that does not exist is left to the call, which
/// reports it; only a path that leaves the folder is refused here (no file's contents are read).
pub fn escaping_files(dir: &Path, m: &sm4c_runtime::Machine) -> Vec<sm4c_runtime::ValidationError> {
    use sm4c_runtime::model::FunctionKind;
    let listed = m.source.get("functions").and_then(serde_json::Value::as_array);
    let mut errs = Vec::new();
    for (i, f) in m.functions.iter().enumerate() {
        let what = match f.kind {
            FunctionKind::Rest => "REST",
            FunctionKind::Rpc => "gRPC",
            _ => continue,
        };
        let Some((file, _)) = f.operation.rsplit_once('#') else {
            continue;
        };
        if file.contains("://") && !file.starts_with("file://") {
            continue;
        }
        if let Err(e) = resolve_uri(dir, file) {
            if e.contains("is outside the folder") {
                let index = listed
                    .and_then(|list| {
                        list.iter()
                            .position(|d| d.get("name").and_then(serde_json::Value::as_str) == Some(&f.name))
                    })
                    .unwrap_or(i);
                errs.push(sm4c_runtime::ValidationError {
                    pointer: format!("/functions/{index}/operation"),
                    message: format!("{what} function {:?}: operation {:?}: {e}", f.name, f.operation),
                });
            }
        }
    }
    errs
}

/// Reads a file [`resolve_in`] returned, at most [`MAX_FILE`] bytes of it (it may have grown since).
pub fn read_text(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE + 1).read_to_string(&mut text))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_FILE {
        return Err(format!(
            "{} is more than the {MAX_FILE} bytes a file may have",
            path.display()
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_outside_the_folder_are_refused() {
        let top = tempfile::tempdir().unwrap();
        let defs = top.path().join("defs");
        std::fs::create_dir_all(defs.join("sub")).unwrap();
        std::fs::write(defs.join("api.json"), "{}").unwrap();
        std::fs::write(defs.join("sub/b.json"), "{}").unwrap();
        std::fs::write(top.path().join("secret.txt"), "s3cret").unwrap();
        std::os::unix::fs::symlink(top.path().join("secret.txt"), defs.join("link.json")).unwrap();
        std::os::unix::fs::symlink(defs.join("api.json"), defs.join("inside.json")).unwrap();
        for ok in [
            "api.json",
            "file://api.json",
            "./sub/../api.json",
            "sub/b.json",
            "inside.json#x",
        ] {
            let p = resolve_uri(&defs, ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert!(p.starts_with(defs.canonicalize().unwrap()), "{ok}: {}", p.display());
        }
        let secret = top.path().join("secret.txt");
        for bad in [
            "../secret.txt".to_string(),
            "sub/../../secret.txt".to_string(),
            format!("file://{}", secret.display()),
            secret.display().to_string(),
            "link.json".to_string(),
        ] {
            let e = resolve_uri(&defs, &bad).unwrap_err();
            assert!(e.contains("is outside the folder"), "{bad}: {e}");
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
        // Another root lets its files be read.
        assert!(resolve_in(&defs, &[&defs, top.path()], "../secret.txt").is_ok());
        // Only regular files.
        let e = resolve_uri(&defs, "sub").unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let e = resolve_uri(&defs, "https://x/a.json").unwrap_err();
        assert!(e.contains("remote"), "{e}");
    }

    #[test]
    fn files_over_the_size_cap_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(dir.path().join("big.json")).unwrap();
        f.set_len(MAX_FILE + 1).unwrap();
        let e = resolve_uri(dir.path(), "big.json").unwrap_err();
        assert!(e.contains("more than the 16777216 bytes"), "{e}");
    }
}

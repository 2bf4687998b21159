//! A database of a test's own on the test PostgreSQL server, dropped when the test is done
//! with it.
//!
//! Every test that stores anything creates a database; a suite of hundreds of tests that
//! left theirs behind grew the server's data directory by gigabytes (one CI run ran out of
//! disk). [`ScratchDatabase`] drops its database when it goes out of scope, with
//! `WITH (FORCE)`, so a server or store still connected to it is no obstacle.

use anyhow::{Context, Result};

/// The environment variable `hack/test.sh` sets to an admin DSN of the PostgreSQL it started.
pub const TEST_DATABASE_URL: &str = "MCP_TEST_DATABASE_URL";

/// A database created for one test, dropped on drop.
#[derive(Debug)]
pub struct ScratchDatabase {
    /// libpq DSN of an admin connection to the server (any database but this one).
    admin: String,
    name: String,
    dsn: String,
}

impl ScratchDatabase {
    /// Creates a database named `{prefix}_{random}` in the server `admin_dsn` names.
    pub fn create(admin_dsn: &str, prefix: &str) -> Result<Self> {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        execute(admin_dsn, format!("CREATE DATABASE {name}"))
            .with_context(|| format!("cannot create the test database {name}"))?;
        let dsn = with_dbname(admin_dsn, &name);
        Ok(Self {
            admin: admin_dsn.to_string(),
            name,
            dsn,
        })
    }

    /// Creates one in the server `hack/test.sh` started (`MCP_TEST_DATABASE_URL`).
    ///
    /// # Panics
    /// When the variable is unset (the test was not run through `hack/test.sh`) or the
    /// database cannot be created.
    pub fn for_test(prefix: &str) -> Self {
        let admin = std::env::var(TEST_DATABASE_URL).unwrap_or_else(|_| {
            panic!(
                "{TEST_DATABASE_URL} is not set: run the tests through hack/test.sh, which starts PostgreSQL"
            )
        });
        Self::create(&admin, prefix).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A DSN of this database: the admin DSN with its database replaced.
    pub fn dsn(&self) -> &str {
        &self.dsn
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        if let Err(e) = execute(&self.admin, sql) {
            eprintln!("warning: test database {} not dropped: {e:#}", self.name);
        }
    }
}

/// `dsn` (libpq key=value or a `postgres://` URL) naming database `name` instead.
fn with_dbname(dsn: &str, name: &str) -> String {
    match dsn.split_once("://") {
        Some((scheme, rest)) => {
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            let authority = path.split('/').next().unwrap_or_default();
            let query = if query.is_empty() {
                String::new()
            } else {
                format!("?{query}")
            };
            format!("{scheme}://{authority}/{name}{query}")
        }
        None => {
            let mut kvs: Vec<String> = dsn
                .split_whitespace()
                .filter(|kv| !kv.starts_with("dbname="))
                .map(str::to_string)
                .collect();
            kvs.push(format!("dbname={name}"));
            kvs.join(" ")
        }
    }
}

/// Runs one statement on an admin connection, on a thread of its own with its own runtime:
/// callable from synchronous code and from inside a test's runtime alike (and from `drop`).
fn execute(admin_dsn: &str, sql: String) -> Result<()> {
    let admin = admin_dsn.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
                .await
                .context("cannot connect to the test PostgreSQL")?;
            let driver = tokio::spawn(conn);
            client.batch_execute(&sql).await?;
            drop(client);
            let _ = driver.await;
            anyhow::Ok(())
        })
    })
    .join()
    .unwrap_or_else(|_| Err(anyhow::anyhow!("the statement's thread panicked")))
}

#[cfg(test)]
mod tests {
    use super::with_dbname;

    #[test]
    fn the_database_is_replaced_in_either_form_of_dsn() {
        assert_eq!(
            with_dbname("host=127.0.0.1 port=5 user=postgres dbname=postgres", "t_1"),
            "host=127.0.0.1 port=5 user=postgres dbname=t_1"
        );
        assert_eq!(
            with_dbname("host=/run/pg", "t_1"),
            "host=/run/pg dbname=t_1"
        );
        assert_eq!(
            with_dbname(
                "postgres://postgres@127.0.0.1:5/postgres?sslmode=disable",
                "t_1"
            ),
            "postgres://postgres@127.0.0.1:5/t_1?sslmode=disable"
        );
        assert_eq!(
            with_dbname("postgresql://127.0.0.1", "t_1"),
            "postgresql://127.0.0.1/t_1"
        );
    }
}

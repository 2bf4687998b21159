//! The built plugin as kubectl runs it (`kubectl access ...` execs `kubectl-access ...`): the
//! commands it offers, and a refusal naming what is wrong for an unknown one, before any
//! cluster is contacted. The commands themselves run against a real cluster in
//! `e2e/tests/cluster/kubectl_access.rs`, which also needs this binary built by the test
//! compile (`cargo test --workspace --all-targets --no-run` builds a package's binaries only
//! for its integration tests).

use std::process::Command;

fn plugin(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-access"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("run kubectl-access")
}

#[test]
fn help_lists_every_command() {
    let out = plugin(&["--help"]);
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for command in ["status", "who-can", "revoke", "retire", "enroll", "token"] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{command} "))),
            "no {command} in:\n{help}"
        );
    }
}

#[test]
fn an_unknown_command_is_refused_with_usage_before_any_request() {
    let out = plugin(&["grant", "everything"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unrecognized subcommand 'grant'"), "{err}");
    assert!(out.stdout.is_empty());
}

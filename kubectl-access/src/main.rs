//! `kubectl-access`: the kubectl plugin of MCP Access (`kubectl access ...` once on PATH).
#![forbid(unsafe_code)]

mod cli;
mod client;
mod enroll;
mod error;
mod render;
mod revoke;
mod sessions;
mod status;
mod token;

use std::io::Write;

use clap::Parser;

use crate::cli::{Cli, Command, EnrollCommand};
use crate::error::Result;

async fn run(cli: Cli) -> Result<String> {
    let ctx = client::connect(&cli.connection).await?;
    match &cli.command {
        Command::Status(args) => {
            let scoped = cli.connection.namespace.is_some() && !args.all_namespaces;
            let report = status::gather(&ctx, args, scoped).await;
            match args.output {
                Some(format) => render::object(&report, format),
                None => Ok(status::render_text(&report)),
            }
        }
        Command::WhoCan(args) => sessions::who_can(&ctx, args).await,
        Command::Revoke(args) => revoke::revoke(&ctx, args).await,
        Command::Retire(args) => revoke::retire(&ctx, args).await,
        Command::Enroll(EnrollCommand::Complete { name }) => enroll::complete(&ctx, name).await,
        Command::Enroll(EnrollCommand::Withdraw { name }) => enroll::withdraw(&ctx, name).await,
        Command::Token(args) => token::token(&ctx, args).await,
    }
}

fn main() {
    let cli = Cli::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(out) => {
            let _ = std::io::stdout().write_all(out.as_bytes());
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}

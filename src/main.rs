//! The `leasehold` command: one binary for every job.
// Production code only (clippy.toml sets the length); a test reads as one scenario.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod demo;
mod ops;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Leader election and a live-node registry on a shared store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Three nodes on a local store: crash the leader, step down, show the handover times.
    Demo(demo::DemoArgs),
    /// Print the LeaderGroup CustomResourceDefinition as YAML.
    Crdgen,
    /// The sidecar: campaign for this pod's LeaderGroups, serve a local API, optionally run a command while leading.
    Agent(Box<leasehold_agent::AgentArgs>),
    /// Reflect the store's state into LeaderGroups and pod labels (in the cluster).
    Controller(leasehold_kube::run::ControllerArgs),
    /// List the registered nodes: lease left, last heartbeat, groups, inbox backlog and drops.
    Nodes(ops::ListArgs),
    /// List the groups that registered nodes have joined: leader, term, expiry, members.
    Groups(ops::ListArgs),
    /// Publish one message to a topic (the payload from an argument or standard input).
    Publish(ops::PublishArgs),
    /// Print the messages of topics or patterns as they arrive, until interrupted.
    Subscribe(ops::SubscribeArgs),
    /// Ask a group's leader to step down, and show who leads next.
    StepDown(ops::StepDownArgs),
    /// Internal: the agent runs its exec-mode command under this guard, so
    /// nothing of the command's process tree outlives the agent.
    #[command(name = leasehold_agent::exec_guard::SUBCOMMAND, hide = true)]
    ExecGuard {
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

fn main() -> std::process::ExitCode {
    if let Err(e) = leasehold_daemon::store_args::adopt_deprecated_variables() {
        eprintln!("error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    // The guard waits for signals with them blocked on its one thread, so it
    // runs before any runtime thread exists that a signal could land on.
    if let Command::ExecGuard { command } = &cli.command {
        return std::process::ExitCode::from(leasehold_agent::exec_guard::run(command));
    }
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> std::process::ExitCode {
    // Long-running jobs log what they do; one-shot commands only problems.
    let quiet = !matches!(cli.command, Command::Controller(_) | Command::Agent(_));
    leasehold_daemon::init_logging(if quiet { "warn" } else { "info" });
    // The errors of the crates, of the store clients and of kube write their
    // causes into their messages and chain them (`source()`): they are
    // taken in flat (`anyhow::Error::msg`), here and in the commands, so
    // `{e:#}` below prints each cause once, after the contexts added here.
    let result: anyhow::Result<()> = match cli.command {
        Command::Demo(args) => demo::run(args).await,
        Command::Controller(args) => leasehold_kube::run::run(args)
            .await
            .map_err(anyhow::Error::msg),
        Command::Agent(args) => match leasehold_agent::run(*args).await {
            // Exec mode passes the command's own exit code on.
            Ok(code) => return std::process::ExitCode::from(code),
            Err(e) => Err(anyhow::Error::msg(e)),
        },
        Command::Nodes(args) => ops::nodes(args).await,
        Command::Groups(args) => ops::groups(args).await,
        Command::Publish(args) => ops::publish(args).await,
        Command::Subscribe(args) => ops::subscribe(args).await,
        Command::StepDown(args) => ops::step_down(args).await,
        Command::ExecGuard { .. } => unreachable!("handled before logging starts"),
        Command::Crdgen => leasehold_kube::crd::crd_yaml()
            .map(|yaml| print!("{yaml}"))
            .map_err(anyhow::Error::msg),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // "context: cause", as the messages read before anyhow.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

//! The agent's flags, checked: [`Settings`] is what the agent will do, and
//! [`Settings::from_args`] refuses a bad flag by name before anything
//! starts, so a mistake fails at once rather than at the first election.

use std::time::Duration;

use leasehold_daemon::error::FlagError;
use leasehold_daemon::names::{validate_cluster_name, validate_object_name, NamespacedName, PodId};
use leasehold_engine::config::{
    validate_name, ConfigError, ElectionConfig, InboxConfig, NodeConfig,
};

use crate::args::AgentArgs;
use crate::{config, exec, health};

/// The arguments, checked: what the agent will do.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub node_id: String,
    /// `(LeaderGroup name, engine group NAMESPACE/NAME)`.
    pub groups: Vec<(String, String)>,
    pub election: ElectionConfig,
    /// The priority this pod campaigns with in every group.
    pub priority: u32,
    /// How the application's health is checked, if it is.
    pub health: Option<health::HealthSettings>,
    pub node: NodeConfig,
    pub grace: Duration,
    pub command: Vec<String>,
    /// Subscriptions made at start.
    pub subscribe: Vec<String>,
    pub inbox: InboxConfig,
}

impl Settings {
    /// Checks every flag and names the one at fault, before anything starts.
    pub fn from_args(args: &AgentArgs) -> Result<Self, FlagError> {
        object_name("--namespace", &args.namespace)?;
        let node_id = Self::node_id(args)?;
        let groups = Self::groups(args)?;
        let election = args.election.config()?;
        let node = NodeConfig::with_lease(args.node_lease_ms);
        node.validate()
            .map_err(|e| FlagError::new("--node-lease-ms", e))?;
        Self::check_exec(args, groups.len(), &election)?;
        Ok(Self {
            node_id,
            groups,
            election,
            priority: Self::priority(args)?,
            health: Self::health(args)?,
            node,
            grace: Duration::from_millis(args.grace_period_ms),
            command: args.command.clone(),
            subscribe: Self::subscriptions(args)?,
            inbox: Self::inbox(args)?,
        })
    }

    /// `--node-id`, or `[CLUSTER/]NAMESPACE/POD_NAME`.
    fn node_id(args: &AgentArgs) -> Result<String, FlagError> {
        if let Some(cluster) = &args.cluster {
            validate_cluster_name("--cluster", cluster)
                .map_err(|e| FlagError::worded("--cluster", e.to_string()))?;
        }
        let node_id = match (&args.node_id, &args.pod_name) {
            (Some(id), _) => id.clone(),
            (None, Some(pod)) => {
                object_name("POD_NAME", pod)?;
                let id = PodId {
                    cluster: args.cluster.as_deref(),
                    namespace: &args.namespace,
                    pod,
                };
                id.to_string()
            }
            (None, None) => {
                return Err(FlagError::worded(
                    "POD_NAME",
                    "no node id: set POD_NAME (from the downward API) or --node-id",
                ))
            }
        };
        validate_name("--node-id", &node_id)
            .map_err(|e| FlagError::worded("--node-id", e.to_string()))?;
        Ok(node_id)
    }

    /// `--priority`: a whole number from 0 to MAX_PRIORITY; unset or empty
    /// (a downward-API annotation the pod does not have) is the default.
    fn priority(args: &AgentArgs) -> Result<u32, FlagError> {
        let text = args.priority.as_deref().map(str::trim).unwrap_or("");
        if text.is_empty() {
            return Ok(leasehold_engine::DEFAULT_PRIORITY);
        }
        let out_of_range = || {
            FlagError::worded(
                "--priority",
                format!(
                    "--priority = {text:?} is out of range: it must be a whole number from 0 (never leads) to {}",
                    leasehold_engine::MAX_PRIORITY
                ),
            )
        };
        let priority: u32 = text.parse().map_err(|_| out_of_range())?;
        leasehold_engine::config::validate_priority("--priority", priority)
            .map_err(|_| out_of_range())?;
        Ok(priority)
    }

    /// `--health-url` or `--health-command`, with its timeout and count.
    fn health(args: &AgentArgs) -> Result<Option<health::HealthSettings>, FlagError> {
        let check = match (&args.health_url, &args.health_command) {
            (Some(url), _) => health::Check::url(url)
                .map_err(|e| FlagError::worded("--health-url", e.to_string()))?,
            (None, Some(line)) if !line.trim().is_empty() => health::Check::Command(line.clone()),
            (None, Some(_)) => {
                return Err(FlagError::worded(
                    "--health-command",
                    "--health-command is empty",
                ))
            }
            (None, None) => return Ok(None),
        };
        if !(1..=health::MAX_HEALTH_TIMEOUT_MS).contains(&args.health_timeout_ms) {
            return Err(FlagError::worded("--health-timeout-ms", format!(
                "--health-timeout-ms = {} is out of range: it must be a whole number of milliseconds from 1 to {}",
                args.health_timeout_ms,
                health::MAX_HEALTH_TIMEOUT_MS
            )));
        }
        if !(1..=health::MAX_HEALTH_FAILURES).contains(&args.health_failures) {
            return Err(FlagError::worded(
                "--health-failures",
                format!(
                "--health-failures = {} is out of range: it must be a whole number from 1 to {}",
                args.health_failures,
                health::MAX_HEALTH_FAILURES
            ),
            ));
        }
        Ok(Some(health::HealthSettings {
            check,
            timeout: Duration::from_millis(args.health_timeout_ms),
            failures: args.health_failures,
        }))
    }

    /// `(LeaderGroup name, engine group name)` per `--group`, each once.
    fn groups(args: &AgentArgs) -> Result<Vec<(String, String)>, FlagError> {
        let mut groups: Vec<(String, String)> = Vec::new();
        for name in &args.groups {
            object_name("--group", name)?;
            if groups.iter().any(|(n, _)| n == name) {
                return Err(FlagError::worded(
                    "--group",
                    format!("--group {name:?} is given twice"),
                ));
            }
            groups.push((
                name.clone(),
                NamespacedName::new(&args.namespace, name).to_string(),
            ));
        }
        Ok(groups)
    }

    /// The grace period, and in exec mode one group, a command that exists
    /// and a grace period that fits the timings.
    fn check_exec(
        args: &AgentArgs,
        groups: usize,
        election: &ElectionConfig,
    ) -> Result<(), FlagError> {
        if args.grace_period_ms > config::MAX_EXEC_GRACE_MS {
            return Err(FlagError::worded("--grace-period-ms", format!(
                "--grace-period-ms = {} is out of range: it must be a whole number of milliseconds from 0 to {}",
                args.grace_period_ms,
                config::MAX_EXEC_GRACE_MS
            )));
        }
        if args.command.is_empty() {
            return Ok(());
        }
        if groups != 1 {
            return Err(FlagError::worded("--group", format!(
                "exec mode runs the command while this pod leads one group; {groups} --group flags were given"
            )));
        }
        exec::check_program(&args.command[0])?;
        // The command is stopped once less than the grace period is left
        // on the lease; a healthy renewal cycle, even one slow by a retry
        // interval, must never get there. (Timings adopted later from the
        // LeaderGroup shorten the grace period instead: see `exec`.)
        let room = exec::grace_room(election).as_millis();
        if u128::from(args.grace_period_ms) > room {
            return Err(FlagError::worded("--grace-period-ms", format!(
                "--grace-period-ms = {} is too long for these timings: exec mode needs at most ttl - renew interval - retry interval - 40 ms = {room} ms",
                args.grace_period_ms
            )));
        }
        Ok(())
    }

    /// `--subscribe` patterns, checked, each once.
    fn subscriptions(args: &AgentArgs) -> Result<Vec<String>, FlagError> {
        let mut subscribe: Vec<String> = Vec::new();
        for pattern in &args.subscribe {
            leasehold_engine::inbox::topic::validate_subscription(pattern)
                .map_err(|e| FlagError::worded("--subscribe", format!("--subscribe: {e}")))?;
            if !subscribe.contains(pattern) {
                subscribe.push(pattern.clone());
            }
        }
        Ok(subscribe)
    }

    /// The inbox limits, within the engine's own bounds, naming the flag.
    fn inbox(args: &AgentArgs) -> Result<InboxConfig, FlagError> {
        let mut inbox = InboxConfig::with_max_length(args.inbox_max_length);
        if let Some(threshold) = args.inbox_lag_threshold {
            inbox.lag_threshold = threshold;
        }
        inbox.validate().map_err(|e| {
            let flag = match e {
                ConfigError::OutOfBounds {
                    option: "lag_threshold",
                    ..
                } => "--inbox-lag-threshold",
                _ => "--inbox-max-length",
            };
            FlagError::new(flag, e)
        })?;
        Ok(inbox)
    }
}

/// A Kubernetes object name given as `flag`, or what is wrong with it.
fn object_name(flag: &'static str, value: &str) -> Result<(), FlagError> {
    validate_object_name(flag, value).map_err(|e| FlagError::worded(flag, e.to_string()))
}

//! Commands one node's engine sends another's, such as the controller asking
//! a leader to step down. They travel in the target's command stream, apart
//! from its inbox (into the inbox for a node of an older version), and the
//! receiving engine acts on them itself; the application never sees them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "camelCase")]
pub enum Command {
    /// Step down from `group` (release and abstain for one ttl); with
    /// `to`, hand the seat to that member ([`crate::Node::hand_over`]).
    /// Absent from the JSON when none, so an older node reads a plain
    /// step-down as before.
    StepDown {
        group: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<String>,
    },
}

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_travel_as_tagged_json() {
        let c = Command::StepDown {
            group: "shop/web".into(),
            to: None,
        };
        assert_eq!(c.encode(), br#"{"command":"stepDown","group":"shop/web"}"#);
        assert_eq!(Command::decode(&c.encode()).unwrap(), c);
        let to = Command::StepDown {
            group: "shop/web".into(),
            to: Some("shop/web-2".into()),
        };
        assert_eq!(
            to.encode(),
            br#"{"command":"stepDown","group":"shop/web","to":"shop/web-2"}"#
        );
        assert_eq!(Command::decode(&to.encode()).unwrap(), to);
        assert!(Command::decode(b"{\"command\":\"reboot\"}").is_err());
    }
}

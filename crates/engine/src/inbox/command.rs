//! Commands one node's engine sends another's, such as the controller asking
//! a leader to step down. They travel in the target's command stream, apart
//! from its inbox (into the inbox for a node of an older version), and the
//! receiving engine acts on them itself; the application never sees them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "camelCase")]
pub enum Command {
    /// Step down from `group` (release and abstain for one ttl).
    StepDown { group: String },
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
        };
        assert_eq!(c.encode(), br#"{"command":"stepDown","group":"shop/web"}"#);
        assert_eq!(Command::decode(&c.encode()).unwrap(), c);
        assert!(Command::decode(b"{\"command\":\"reboot\"}").is_err());
    }
}

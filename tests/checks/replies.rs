//! Store replies are read by name, never by position: a column a migration
//! adds, or an element a script adds, must not shift what another read
//! means. Read from the sources under `crates/`:
//!
//! - no `int_at`/`string_at` reply helper, and no PostgreSQL row or reply
//!   element read by an index (`row.get(0)`, `get::<_, i64>(3)`,
//!   `try_get(1)`): a row is read by column name, a script reply through its
//!   type's `FromRedisValue` (`store/redis/reply.rs`);
//! - a Lua script names its KEYS and ARGV at the top (`local lease_key =
//!   KEYS[1]`, `local ttl = tonumber(ARGV[3])`), and its body reads only
//!   those names (a variable index such as `ARGV[m + 4]` is a list, not a
//!   position).
//!
//! Each finding names the file and line.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every file under `dir` whose name ends in `ext`.
fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.to_string_lossy().ends_with(ext) {
            out.push(path);
        }
    }
}

/// Whether `line` reads something by an integer index: `get(3)` or
/// `try_get(3)`, with or without a turbofish, after a `.` or `::`.
fn indexed_get(line: &str) -> bool {
    let mut rest = line;
    while let Some(at) = rest.find("get") {
        let before = &rest[..at];
        let after = &rest[at + 3..];
        rest = after;
        if !(before.ends_with('.') || before.ends_with(".try_") || before.ends_with("::")) {
            continue;
        }
        let after = match after.strip_prefix("::<") {
            Some(generic) => {
                // Skip the turbofish, angle brackets balanced.
                let mut depth = 1;
                let end = generic.char_indices().find_map(|(i, c)| {
                    depth += match c {
                        '<' => 1,
                        '>' => -1,
                        _ => 0,
                    };
                    (depth == 0).then_some(i)
                });
                match end {
                    Some(end) => &generic[end + 1..],
                    None => continue,
                }
            }
            None => after,
        };
        let Some(argument) = after.strip_prefix('(') else {
            continue;
        };
        let argument = argument.trim_start();
        let digits = argument.len()
            - argument
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .len();
        if digits > 0 && argument[digits..].trim_start().starts_with(')') {
            return true;
        }
    }
    false
}

/// Whether `line` names KEYS or ARGV elements: `local a, b = X, Y` where
/// each of X, Y is `KEYS[n]`, `ARGV[n]` or `tonumber(ARGV[n])`.
fn names_arguments(line: &str) -> bool {
    let Some((names, values)) = line
        .strip_prefix("local ")
        .and_then(|l| l.split_once(" = "))
    else {
        return false;
    };
    let element = |v: &str| {
        let v = v.trim();
        let v = v
            .strip_prefix("tonumber(")
            .and_then(|v| v.strip_suffix(')'))
            .unwrap_or(v);
        let index = v
            .strip_prefix("KEYS[")
            .or_else(|| v.strip_prefix("ARGV["))
            .and_then(|v| v.strip_suffix(']'));
        index.is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    };
    let names: Vec<&str> = names.split(',').map(str::trim).collect();
    let values: Vec<&str> = values.split(',').collect();
    names.len() == values.len()
        && names
            .iter()
            .all(|n| !n.is_empty() && n.chars().all(|c| c.is_alphanumeric() || c == '_'))
        && values.iter().all(|v| element(v))
}

/// Whether `line` holds `KEYS[` or `ARGV[` followed by a digit.
fn positional_argument(line: &str) -> bool {
    ["KEYS[", "ARGV["].iter().any(|open| {
        line.match_indices(open).any(|(at, _)| {
            line[at + open.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
    })
}

/// The positional reads under `root`, as `file:line: text`.
fn positional_reads(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut rust = Vec::new();
    files(root, ".rs", &mut rust);
    for path in &rust {
        let text = std::fs::read_to_string(path).expect("read");
        for (i, line) in text.lines().enumerate() {
            if line.contains("int_at") || line.contains("string_at") || indexed_get(line) {
                found.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    let mut lua = Vec::new();
    files(root, ".lua", &mut lua);
    for path in &lua {
        let text = std::fs::read_to_string(path).expect("read");
        // The header's comments, then the lines that name the arguments;
        // from the first other line on, the body.
        let mut in_body = false;
        for (i, line) in text.lines().enumerate() {
            let comment = line.trim().is_empty() || line.trim_start().starts_with("--");
            in_body |= !comment && !names_arguments(line);
            if in_body && !comment && positional_argument(line) {
                found.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    found.sort();
    found
}

#[test]
fn store_replies_are_read_by_name() {
    let crates = Path::new(ROOT).join("crates");
    let mut lua = Vec::new();
    files(&crates, ".lua", &mut lua);
    // The check reads the scripts too: it found them.
    assert!(lua.len() >= 15, "found only {} Lua scripts", lua.len());
    let found = positional_reads(&crates);
    assert!(
        found.is_empty(),
        "replies read by position (read a row by column name, a script reply \
         through its FromRedisValue type in store/redis/reply.rs, and name a \
         script's KEYS and ARGV at its top):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_finds_each_kind_of_positional_read() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("replies-check");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("store.rs"),
        "let won: bool = row.get(\"o_won\");\n\
         let term: i64 = row.get(1);\n\
         let pttl = row.get::<_, Option<i64>>( 2 );\n\
         let n = r.try_get(0)?;\n\
         let ok = items.get(i).is_some() && map.get(&3).is_some();\n\
         let code = int_at(&items, 0)?;\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("claim.lua"),
        "-- KEYS: lease, seat\n\
         -- ARGV: node id, ttl ms, then a list\n\
         local lease_key, seat_key = KEYS[1], KEYS[2]\n\
         local ttl = tonumber(ARGV[2])\n\
         redis.call('GET', lease_key)\n\
         local late = ARGV[1]\n\
         redis.call('DEL', KEYS[2])\n\
         for m = 3, #ARGV do redis.call('SET', ARGV[m], ARGV[m + 1]) end\n",
    )
    .expect("write");
    let lines: Vec<String> = positional_reads(&dir)
        .iter()
        .map(|f| {
            f.rsplit_once('/')
                .map_or(f.clone(), |(_, name)| name.to_owned())
        })
        .collect();
    assert_eq!(
        lines,
        [
            "claim.lua:6: local late = ARGV[1]",
            "claim.lua:7: redis.call('DEL', KEYS[2])",
            "store.rs:2: let term: i64 = row.get(1);",
            "store.rs:3: let pttl = row.get::<_, Option<i64>>( 2 );",
            "store.rs:4: let n = r.try_get(0)?;",
            "store.rs:6: let code = int_at(&items, 0)?;",
        ]
    );
}

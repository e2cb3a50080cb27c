//! Request traces: the Mooncake JSONL and Azure CSV loaders, the transforms
//! (`--rate-scale`, `--limit`, `--sessions-max-turns`), and each request's
//! prompt as chained block hashes for the engines (16-token blocks) and the
//! router (512-token blocks).

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::SimError;
use crate::profile::KV_BLOCK_TOKENS;

/// The router's prefix block size (engine_state_router::BLOCK_TOKENS).
const ROUTER_BLOCK_TOKENS: u64 = engine_state_router::BLOCK_TOKENS as u64;
const KV_PER_ROUTER_BLOCK: u64 = ROUTER_BLOCK_TOKENS / KV_BLOCK_TOKENS;

/// What a prompt's tokens are, as far as prefix sharing goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// One id per 512-token block (Mooncake `hash_ids`: equal id = equal
    /// block and prefix); tokens past the ids are the request's own.
    Blocks(Vec<u64>),
    /// The first `input_len` tokens of an append-only session stream (the
    /// agentic generator): token `t` is the same in every turn.
    Stream(u64),
    /// Nothing shared with any other request (Azure).
    Unique,
}

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    /// Arrival, nanoseconds from the trace's start.
    pub arrival_ns: u64,
    /// Prompt tokens.
    pub input_len: u64,
    /// Tokens generated (at least 1).
    pub output_len: u64,
    /// The session (conversation) it belongs to, if known.
    pub session: Option<u64>,
    /// Its prompt's content.
    pub content: Content,
}

/// A loaded trace, arrivals in order.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Where it came from (for reports).
    pub name: String,
    /// The requests, by arrival.
    pub requests: Vec<TraceRequest>,
    /// Malformed lines skipped (`--skip-bad`).
    pub skipped_lines: usize,
}

/// A 64-bit mixer (splitmix64's finaliser) over two words.
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_add(0x9e37_79b9_7f4a_7c15).rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Salts keeping the id spaces of different content kinds apart.
const UNIQUE_SALT: u64 = 0x756e_6971_7565_0000;
const STREAM_SALT: u64 = 0x7374_7265_616d_0000;

impl TraceRequest {
    /// Content id of 16-token block `block` of this request (`index`: its
    /// position in the trace, for content of its own).
    fn kv_content(&self, index: usize, block: u64) -> u64 {
        let own = || mix(UNIQUE_SALT ^ index as u64, block);
        match &self.content {
            Content::Blocks(ids) => match ids.get((block / KV_PER_ROUTER_BLOCK) as usize) {
                Some(&id) => mix(id, block % KV_PER_ROUTER_BLOCK),
                None => own(),
            },
            Content::Stream(session) => mix(STREAM_SALT ^ session, block),
            Content::Unique => own(),
        }
    }

    /// Content word of token `position` of this request's token stream
    /// (the prompt, and for a session stream the output after it): the
    /// content of its 16-token block ([`TraceRequest::kv_block_hashes`]'s)
    /// mixed with its offset in the block, so two requests' tokens agree
    /// block by block exactly where their block hashes do (`essim replay`
    /// builds its prompts from these).
    pub fn token_content(&self, index: usize, position: u64) -> u64 {
        mix(
            self.kv_content(index, position / KV_BLOCK_TOKENS),
            position % KV_BLOCK_TOKENS,
        )
    }

    /// Chained hashes of the full 16-token blocks the engine's prefix cache
    /// knows in advance ([`crate::EngineRequest::block_hashes`]): the
    /// prompt's, and for a session stream also the output's (the next turn's
    /// prompt contains it; elsewhere the output is the request's own and the
    /// engine hashes it itself).
    pub fn kv_block_hashes(&self, index: usize) -> Vec<u64> {
        let mut parent = 0;
        (0..self.known_tokens() / KV_BLOCK_TOKENS)
            .map(|block| {
                parent = mix(parent, self.kv_content(index, block));
                parent
            })
            .collect()
    }

    /// Chained hashes of the prompt's full 512-token blocks (the router's
    /// `Request::from_block_hashes`), chained over the same content as the
    /// engine's blocks so that router and engine agree on what is shared.
    pub fn router_block_hashes(&self, index: usize) -> Vec<u64> {
        self.router_blocks_over(index, self.input_len)
    }

    /// The same over the tokens [`TraceRequest::kv_block_hashes`] covers
    /// (for a session stream, the output's blocks too): the router blocks an
    /// engine holding this request's KV publishes in its cache digest
    /// ([`crate::EngineRequest::router_block_hashes`]).
    pub fn known_router_block_hashes(&self, index: usize) -> Vec<u64> {
        self.router_blocks_over(index, self.known_tokens())
    }

    /// Tokens whose content is known in advance: the prompt, and for a
    /// session stream the output (the next turn's prompt contains it).
    fn known_tokens(&self) -> u64 {
        match self.content {
            Content::Stream(_) => self.input_len + self.output_len,
            Content::Blocks(_) | Content::Unique => self.input_len,
        }
    }

    fn router_blocks_over(&self, index: usize, tokens: u64) -> Vec<u64> {
        let mut parent = 0;
        (0..tokens / ROUTER_BLOCK_TOKENS)
            .map(|block| {
                let content = match &self.content {
                    Content::Blocks(ids) => ids.get(block as usize).copied(),
                    Content::Stream(session) => Some(mix(STREAM_SALT ^ session, block)),
                    Content::Unique => None,
                }
                .unwrap_or_else(|| mix(UNIQUE_SALT ^ index as u64, block | 1 << 40));
                parent = mix(parent, content);
                parent
            })
            .collect()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MooncakeLine {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

fn read(path: &Path) -> Result<String, SimError> {
    std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => SimError::MissingTrace(path.to_owned()),
        _ => SimError::io(path, e),
    })
}

/// Keep or skip a bad line, per `skip_bad`.
fn bad_line(
    path: &Path,
    line: usize,
    reason: String,
    skip_bad: bool,
    skipped: &mut usize,
) -> Result<(), SimError> {
    if skip_bad {
        *skipped += 1;
        Ok(())
    } else {
        Err(SimError::TraceLine {
            path: path.to_owned(),
            line,
            reason,
        })
    }
}

impl Trace {
    /// Load Mooncake JSONL (`timestamp` ms, `input_length`, `output_length`,
    /// `hash_ids`). Sessions: a request whose leading hash ids cover all but
    /// at most the last block of an earlier request's ids continues that
    /// request's session (multi-turn: each turn's prompt holds the previous
    /// one); otherwise it starts one.
    pub fn mooncake(path: &Path, skip_bad: bool) -> Result<Trace, SimError> {
        let text = read(path)?;
        let mut trace = Trace {
            name: path.file_name().map_or_else(
                || "mooncake".to_owned(),
                |n| n.to_string_lossy().into_owned(),
            ),
            ..Trace::default()
        };
        // Block id → (session, its hash-id count in that session's latest request).
        let mut owner: HashMap<u64, u64> = HashMap::new();
        let mut latest_len: Vec<usize> = Vec::new();
        for (number, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let parsed: MooncakeLine = match serde_json::from_str(line) {
                Ok(parsed) => parsed,
                Err(e) => {
                    bad_line(
                        path,
                        number + 1,
                        e.to_string(),
                        skip_bad,
                        &mut trace.skipped_lines,
                    )?;
                    continue;
                }
            };
            if !(parsed.timestamp.is_finite() && parsed.timestamp >= 0.0)
                || parsed.input_length == 0
            {
                let reason = "timestamp must be ≥ 0 and input_length ≥ 1".to_owned();
                bad_line(path, number + 1, reason, skip_bad, &mut trace.skipped_lines)?;
                continue;
            }
            let depth = parsed
                .hash_ids
                .iter()
                .take_while(|id| owner.contains_key(id))
                .count();
            let continued = depth
                .checked_sub(1)
                .map(|last| owner[&parsed.hash_ids[last]])
                .filter(|&s| depth + 1 >= latest_len[s as usize] && depth > 0);
            let session = continued.unwrap_or_else(|| {
                latest_len.push(0);
                latest_len.len() as u64 - 1
            });
            latest_len[session as usize] = parsed.hash_ids.len();
            for &id in &parsed.hash_ids {
                owner.insert(id, session);
            }
            trace.requests.push(TraceRequest {
                arrival_ns: (parsed.timestamp * 1e6).round() as u64,
                input_len: parsed.input_length,
                output_len: parsed.output_length.max(1),
                session: Some(session),
                content: Content::Blocks(parsed.hash_ids),
            });
        }
        trace.sort();
        Ok(trace)
    }

    /// Load the Azure LLM inference CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`):
    /// no sessions, no shared prefixes.
    pub fn azure(path: &Path, skip_bad: bool) -> Result<Trace, SimError> {
        let text = read(path)?;
        let mut trace = Trace {
            name: path
                .file_name()
                .map_or_else(|| "azure".to_owned(), |n| n.to_string_lossy().into_owned()),
            ..Trace::default()
        };
        let mut start = None;
        for (number, line) in text.lines().enumerate() {
            if number == 0 || line.trim().is_empty() {
                continue; // header
            }
            let parsed = parse_azure(line);
            let Some((time_ns, context, generated)) = parsed.filter(|p| p.1 > 0) else {
                let reason = format!(
                    "expected `YYYY-MM-DD HH:MM:SS.fffffff,ContextTokens,GeneratedTokens` \
                     with ContextTokens ≥ 1, found {line:?}"
                );
                bad_line(path, number + 1, reason, skip_bad, &mut trace.skipped_lines)?;
                continue;
            };
            let start = *start.get_or_insert(time_ns);
            trace.requests.push(TraceRequest {
                arrival_ns: time_ns.saturating_sub(start),
                input_len: context,
                output_len: generated.max(1),
                session: None,
                content: Content::Unique,
            });
        }
        trace.sort();
        Ok(trace)
    }

    fn sort(&mut self) {
        // Stable: equal timestamps keep file order (multi-turn order).
        self.requests.sort_by_key(|r| r.arrival_ns);
    }

    /// Arrivals `factor` times as dense (2 = twice the rate).
    pub fn rate_scale(&mut self, factor: f64) -> Result<(), SimError> {
        if !(factor.is_finite() && factor > 0.0) {
            return Err(SimError::Config(format!(
                "--rate-scale must be > 0, got {factor}"
            )));
        }
        for r in &mut self.requests {
            r.arrival_ns = (r.arrival_ns as f64 / factor).round() as u64;
        }
        Ok(())
    }

    /// Keep each session's first `turns` requests.
    pub fn sessions_max_turns(&mut self, turns: usize) {
        let mut seen: HashMap<u64, usize> = HashMap::new();
        self.requests.retain(|r| match r.session {
            Some(s) => {
                let n = seen.entry(s).or_default();
                *n += 1;
                *n <= turns
            }
            None => true,
        });
    }

    /// Keep the first `limit` requests.
    pub fn limit(&mut self, limit: usize) {
        self.requests.truncate(limit);
    }

    /// Simulated span: the last arrival.
    pub fn span_ns(&self) -> u64 {
        self.requests.last().map_or(0, |r| r.arrival_ns)
    }
}

impl Trace {
    /// A short description: counts, span, lengths, sessions and shared blocks.
    pub fn stats(&self) -> String {
        let n = self.requests.len();
        let mut inputs: Vec<f64> = self.requests.iter().map(|r| r.input_len as f64).collect();
        let mut outputs: Vec<f64> = self.requests.iter().map(|r| r.output_len as f64).collect();
        inputs.sort_by(f64::total_cmp);
        outputs.sort_by(f64::total_cmp);
        let q = crate::metrics::quantile;
        let mut turns: HashMap<u64, usize> = HashMap::new();
        for r in &self.requests {
            if let Some(s) = r.session {
                *turns.entry(s).or_default() += 1;
            }
        }
        let multi = turns.values().filter(|&&t| t > 1).count();
        let most = turns.values().copied().max().unwrap_or(0);
        let (mut blocks, mut repeated) = (0usize, 0usize);
        let mut seen = std::collections::HashSet::new();
        for (i, r) in self.requests.iter().enumerate() {
            for hash in r.router_block_hashes(i) {
                blocks += 1;
                repeated += usize::from(!seen.insert(hash));
            }
        }
        format!(
            "trace {}: {n} requests over {:.0} s ({:.2} req/s), {} bad lines skipped\n\
             input tokens p50 {:.0} p90 {:.0} max {:.0}; output tokens p50 {:.0} p90 {:.0} max {:.0}\n\
             sessions {} ({multi} with more than one turn, longest {most} turns)\n\
             512-token blocks {blocks}, {:.1}% repeating an earlier prefix",
            self.name,
            self.span_ns() as f64 / 1e9,
            n as f64 / (self.span_ns() as f64 / 1e9).max(1e-9),
            self.skipped_lines,
            q(&inputs, 0.5),
            q(&inputs, 0.9),
            q(&inputs, 1.0),
            q(&outputs, 0.5),
            q(&outputs, 0.9),
            q(&outputs, 1.0),
            turns.len(),
            100.0 * repeated as f64 / blocks.max(1) as f64,
        )
    }
}

/// `2023-11-16 18:15:46.6805900,374,44` → (ns since the epoch, 374, 44).
fn parse_azure(line: &str) -> Option<(u64, u64, u64)> {
    let mut fields = line.split(',');
    let (stamp, context, generated) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() {
        return None;
    }
    let (date, time) = stamp.trim().split_once(' ')?;
    let mut ymd = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (ymd.next()??, ymd.next()??, ymd.next()??);
    let mut hms = time.split(':');
    let (h, min, sec) = (hms.next()?, hms.next()?, hms.next()?);
    let (h, min): (u64, u64) = (h.parse().ok()?, min.parse().ok()?);
    let sec: f64 = sec.parse().ok()?;
    if !(1..=12).contains(&m)
        || !(1..=31).contains(&d)
        || h > 23
        || min > 59
        || !(0.0..61.0).contains(&sec)
    {
        return None;
    }
    let days = u64::try_from(days_from_civil(y, m, d)).ok()?;
    let ns = (days * 86_400 + h * 3600 + min * 60) * 1_000_000_000 + (sec * 1e9).round() as u64;
    Some((
        ns,
        context.trim().parse().ok()?,
        generated.trim().parse().ok()?,
    ))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
        file
    }

    #[test]
    fn mooncake_sessions_follow_shared_leading_blocks() {
        let file = write(concat!(
            r#"{"timestamp": 0, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 3]}"#,
            "\n",
            r#"{"timestamp": 5, "input_length": 900, "output_length": 5, "hash_ids": [7, 8]}"#,
            "\n",
            r#"{"timestamp": 9, "input_length": 2100, "output_length": 5, "hash_ids": [1, 2, 4, 5, 6]}"#,
            "\n",
            r#"{"timestamp": 12, "input_length": 600, "output_length": 5, "hash_ids": [1, 9]}"#,
            "\n",
        ));
        let trace = Trace::mooncake(file.path(), false).unwrap();
        let sessions: Vec<_> = trace.requests.iter().map(|r| r.session.unwrap()).collect();
        assert_eq!(
            sessions,
            vec![0, 1, 0, 2],
            "a shared first block alone is not a session"
        );
        assert_eq!(trace.requests[2].arrival_ns, 9_000_000);
        // Shared ids → equal leading hashes, for the engine and the router alike.
        let (a, c) = (&trace.requests[0], &trace.requests[2]);
        assert_eq!(a.kv_block_hashes(0)[..64], c.kv_block_hashes(2)[..64]);
        assert_ne!(a.kv_block_hashes(0)[64], c.kv_block_hashes(2)[64]);
        assert_eq!(a.router_block_hashes(0)[..2], c.router_block_hashes(2)[..2]);
        assert_eq!(
            a.router_block_hashes(0).len(),
            2,
            "full 512-token blocks only"
        );
    }

    #[test]
    fn a_malformed_line_is_an_error_naming_file_and_line_unless_skipped() {
        let file = write(concat!(
            r#"{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}"#,
            "\n",
            r#"{"timestamp": 1, "input_length": "ten"}"#,
            "\n",
        ));
        let err = Trace::mooncake(file.path(), false).unwrap_err().to_string();
        let name = file.path().display().to_string();
        assert!(err.starts_with(&format!("{name}:2: ")), "{err}");
        assert!(err.contains("--skip-bad"), "{err}");
        let trace = Trace::mooncake(file.path(), true).unwrap();
        assert_eq!((trace.requests.len(), trace.skipped_lines), (1, 1));

        let csv =
            write("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,374,44\nnope\n");
        let err = Trace::azure(csv.path(), false).unwrap_err().to_string();
        assert!(err.contains(":3: "), "{err}");
    }

    #[test]
    fn a_missing_trace_file_says_where_the_traces_are() {
        let missing = Path::new("no/such/trace.jsonl");
        for err in [
            Trace::mooncake(missing, false).unwrap_err(),
            Trace::azure(missing, false).unwrap_err(),
        ] {
            let text = err.to_string();
            assert!(matches!(err, SimError::MissingTrace(_)), "{text}");
            assert!(
                text.contains("no/such/trace.jsonl")
                    && text.contains("../shared/traces/README.md")
                    && text.contains("--trace PATH"),
                "{text}"
            );
        }
    }

    #[test]
    fn azure_times_are_relative_and_transforms_apply() {
        let csv = write(concat!(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n",
            "2023-11-16 23:59:59.5000000,374,44\n",
            "2023-11-17 00:00:01.0000000,396,0\n",
        ));
        let mut trace = Trace::azure(csv.path(), false).unwrap();
        assert_eq!(trace.requests[1].arrival_ns, 1_500_000_000);
        assert_eq!(trace.requests[1].output_len, 1);
        trace.rate_scale(2.0).unwrap();
        assert_eq!(trace.span_ns(), 750_000_000);
        trace.limit(1);
        assert_eq!(trace.requests.len(), 1);
    }
}

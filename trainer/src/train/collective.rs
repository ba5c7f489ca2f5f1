//! Collectives between the ranks of a data-parallel run: an all-gather of bytes and an all-reduce
//! (sum) of f32 arrays, behind one trait, with two CPU implementations:
//!
//! - [`LocalGroup`]: ranks that are threads of one process (shared memory);
//! - [`TcpGroup`]: ranks in several processes (one per node, or per device), a star through
//!   rank 0 over TCP, rendezvous at `MASTER_ADDR:MASTER_PORT`, for CPU training and for testing
//!   the multi-process path on one machine. GPUs do not use it (their transport is NCCL).
//!
//! Every rank gets the same bytes: a reduction sums the ranks' arrays in rank order on every rank,
//! so parameters stay bit-identical across ranks. A rank that stops (error, panic, exit) or does
//! not arrive within the timeout makes every other rank's next collective fail with a message
//! naming it; nothing waits forever.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Why a collective failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum CollectiveError {
    /// A rank did not arrive in time.
    #[error(
        "rank {rank} of {world} did not reach step synchronisation within {seconds} s (hung, or \
         much slower than the others; train.collective_timeout_seconds)"
    )]
    Timeout {
        /// The missing rank (the lowest, when several).
        rank: usize,
        /// Ranks in all.
        world: usize,
        /// The timeout.
        seconds: f64,
    },
    /// A rank stopped.
    #[error("rank {rank} stopped: {why}")]
    PeerLeft {
        /// The rank.
        rank: usize,
        /// What it reported, or how its connection ended.
        why: String,
    },
    /// A rank runs another world size, config, training set or binary than rank 0.
    #[error(
        "rank {rank} runs world size {world} and fingerprint {fingerprint:016x}, rank 0 world \
         size {ours_world} and fingerprint {ours_fingerprint:016x}: every rank needs the same \
         asrt binary, config and training set"
    )]
    Fingerprint {
        /// The rank that greeted rank 0.
        rank: usize,
        /// Its world size.
        world: usize,
        /// Its fingerprint.
        fingerprint: u64,
        /// Rank 0's world size.
        ours_world: usize,
        /// Rank 0's fingerprint.
        ours_fingerprint: u64,
    },
    /// Something that is not an asrt rank connected to rank 0.
    #[error("a connection that is not an asrt rank reached rank 0")]
    NotARank,
    /// A rank greeted rank 0 twice, or is not one of the world's ranks.
    #[error("rank {rank} joined twice or is outside world size {world}")]
    BadRank {
        /// The rank it claimed.
        rank: usize,
        /// Ranks in all.
        world: usize,
    },
    /// Rank 0 refused this rank, for the reason it sent.
    #[error("rank 0 refused this rank: {0}")]
    Refused(String),
    /// A socket operation failed.
    #[error("{action}: {detail}")]
    Io {
        /// What was being done ("listening on 10.0.0.1:29500", "greeting rank 0", ...).
        action: String,
        /// The error's kind.
        kind: std::io::ErrorKind,
        /// The operating system's message.
        detail: String,
    },
    /// Rank 0's address names no host.
    #[error("{addr} has no address")]
    NoAddress {
        /// `MASTER_ADDR:MASTER_PORT`.
        addr: String,
    },
    /// Rank 0 could not be reached before the timeout.
    #[error("rank {rank} could not reach rank 0 at {addr} within {seconds} s: {detail}")]
    Unreachable {
        /// This rank.
        rank: usize,
        /// Rank 0's address.
        addr: String,
        /// The timeout.
        seconds: f64,
        /// The last connection error.
        detail: String,
    },
    /// A peer sent bytes that do not decode.
    #[error("rank {rank} sent a malformed {what}")]
    Malformed {
        /// The sender.
        rank: usize,
        /// What was expected.
        what: &'static str,
    },
    /// NCCL (or the CUDA driver under it) failed.
    #[error("NCCL, {what}: {detail} (is libnccl installed?)")]
    Nccl {
        /// The step that failed.
        what: &'static str,
        /// cudarc's error.
        detail: String,
    },
    /// A rank's gradients or step record could not be read or written.
    #[error("{what}: {detail}")]
    Exchange {
        /// What was being exchanged.
        what: String,
        /// Why it failed.
        detail: String,
    },
    /// Arrays of different lengths were reduced (a bug).
    #[error("rank {rank} reduced {len} values, rank 0 {expected}")]
    Length {
        /// The rank.
        rank: usize,
        /// Its length.
        len: usize,
        /// Rank 0's.
        expected: usize,
    },
}

/// The collectives a data-parallel step needs.
pub trait Collective: Send {
    /// This rank.
    fn rank(&self) -> usize;
    /// Ranks in all.
    fn world(&self) -> usize;
    /// Every rank's `mine`, in rank order.
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError>;
    /// Tells the others this rank stops, and why (they fail their next collective naming it).
    fn abort(&mut self, why: &str);
    /// Leaves the group at the end of training (nothing to tell the others).
    fn finish(&mut self) {}

    /// `data` summed element-wise over the ranks, in rank order (the same bits on every rank).
    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CollectiveError> {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        let all = self.all_gather(&bytes)?;
        data.iter_mut().for_each(|x| *x = 0.0);
        for (rank, b) in all.iter().enumerate() {
            if b.len() != bytes.len() {
                return Err(CollectiveError::Length {
                    rank,
                    len: b.len() / 4,
                    expected: bytes.len() / 4,
                });
            }
            for (x, c) in data.iter_mut().zip(b.chunks_exact(4)) {
                *x += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Ok(())
    }
}

/// A run of one rank: no communication.
#[derive(Debug, Default)]
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        Ok(vec![mine.to_vec()])
    }
    fn abort(&mut self, _why: &str) {}
}

/// State shared by the threads of a [`LocalGroup`].
#[derive(Debug)]
struct Shared {
    world: usize,
    timeout: Duration,
    state: Mutex<Round>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Round {
    /// Rounds completed.
    generation: u64,
    /// This round's contributions.
    slots: Vec<Option<Vec<u8>>>,
    /// The last completed round's result.
    result: Option<Arc<Vec<Vec<u8>>>>,
    /// A rank that stopped, and why.
    left: Option<(usize, String)>,
}

/// One rank of a group of threads in one process. Dropping it without [`LocalGroup::finish`]
/// counts as the rank stopping.
#[derive(Debug)]
pub struct LocalGroup {
    rank: usize,
    shared: Arc<Shared>,
    finished: bool,
}

impl LocalGroup {
    /// The `world` members of a new group; a member waits at most `timeout` for the others.
    pub fn new(world: usize, timeout: Duration) -> Vec<LocalGroup> {
        let shared = Arc::new(Shared {
            world,
            timeout,
            state: Mutex::new(Round { slots: vec![None; world], ..Round::default() }),
            changed: Condvar::new(),
        });
        (0..world)
            .map(|rank| LocalGroup { rank, shared: Arc::clone(&shared), finished: false })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Round> {
        self.shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for LocalGroup {
    fn drop(&mut self) {
        if !self.finished {
            self.abort("it ended without finishing (an error or a panic on that rank)");
        }
    }
}

impl Collective for LocalGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let shared = Arc::clone(&self.shared);
        let mut round = self.lock();
        if let Some((rank, why)) = &round.left {
            return Err(CollectiveError::PeerLeft { rank: *rank, why: why.clone() });
        }
        let generation = round.generation;
        round.slots[self.rank] = Some(mine.to_vec());
        if round.slots.iter().all(Option::is_some) {
            let all: Vec<Vec<u8>> =
                round.slots.iter_mut().map(|s| s.take().unwrap_or_default()).collect();
            let all = Arc::new(all);
            round.result = Some(Arc::clone(&all));
            round.generation += 1;
            shared.changed.notify_all();
            return Ok(all.to_vec());
        }
        let deadline = Instant::now() + shared.timeout;
        loop {
            let now = Instant::now();
            if now >= deadline {
                let rank = round.slots.iter().position(Option::is_none).unwrap_or(0);
                return Err(CollectiveError::Timeout {
                    rank,
                    world: shared.world,
                    seconds: shared.timeout.as_secs_f64(),
                });
            }
            round = shared
                .changed
                .wait_timeout(round, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
            if round.generation != generation {
                // The round completed; the next cannot complete before this rank joins it, so
                // `result` is still this round's.
                return Ok(round.result.as_ref().map(|r| r.to_vec()).unwrap_or_default());
            }
            if let Some((rank, why)) = &round.left {
                return Err(CollectiveError::PeerLeft { rank: *rank, why: why.clone() });
            }
        }
    }

    fn finish(&mut self) {
        self.finished = true;
    }

    fn abort(&mut self, why: &str) {
        self.finished = true;
        let rank = self.rank;
        let mut round = self.lock();
        if round.left.is_none() {
            round.left = Some((rank, why.to_owned()));
        }
        self.shared.changed.notify_all();
    }
}

/// Where a multi-process run meets, and who this process is in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendezvous {
    /// Rank 0's address (`MASTER_ADDR:MASTER_PORT`).
    pub addr: String,
    /// This member's global rank.
    pub rank: usize,
    /// Members in all.
    pub world: usize,
    /// How long to wait for the others (connecting, and at every collective).
    pub timeout: Duration,
    /// A hash of what every member must agree on (binary, config, training set).
    pub fingerprint: u64,
}

const MAGIC: &[u8; 8] = b"ASRTRDV1";
/// Message kinds on the wire.
const DATA: u8 = 0;
const ABORT: u8 = 1;

/// One rank of a multi-process group: rank 0 holds a connection to every other rank; the others
/// hold one to rank 0. An all-gather sends each rank's bytes to rank 0, which answers every rank
/// with all of them.
#[derive(Debug)]
pub struct TcpGroup {
    rank: usize,
    world: usize,
    timeout: Duration,
    /// Rank 0: connections to ranks 1.. in order; other ranks: the connection to rank 0.
    peers: Vec<TcpStream>,
}

fn net(action: &str) -> impl FnOnce(std::io::Error) -> CollectiveError + '_ {
    move |e| CollectiveError::Io {
        action: action.to_owned(),
        kind: e.kind(),
        detail: e.to_string(),
    }
}

fn write_frame(s: &mut TcpStream, kind: u8, body: &[u8]) -> std::io::Result<()> {
    let mut head = [0u8; 9];
    head[0] = kind;
    head[1..].copy_from_slice(&(body.len() as u64).to_le_bytes());
    s.write_all(&head)?;
    s.write_all(body)?;
    s.flush()
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head)?;
    let mut len = [0u8; 8];
    len.copy_from_slice(&head[1..]);
    let len = u64::from_le_bytes(len);
    if len > 1 << 36 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "frame over 64 GiB"));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body)?;
    Ok((head[0], body))
}

/// A read or write error on rank `rank`'s connection, as the error a collective reports.
fn peer_error(rank: usize, world: usize, timeout: Duration, e: &std::io::Error) -> CollectiveError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            CollectiveError::Timeout { rank, world, seconds: timeout.as_secs_f64() }
        }
        _ => CollectiveError::PeerLeft { rank, why: format!("its connection ended ({e})") },
    }
}

fn encode_all(all: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(all.iter().map(|b| b.len() + 8).sum());
    for b in all {
        out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        out.extend_from_slice(b);
    }
    out
}

fn decode_all(mut body: &[u8], world: usize) -> Option<Vec<Vec<u8>>> {
    let mut all = Vec::with_capacity(world);
    for _ in 0..world {
        let len = u64::from_le_bytes(body.get(..8)?.try_into().ok()?) as usize;
        all.push(body.get(8..8 + len)?.to_vec());
        body = &body[8 + len..];
    }
    Some(all)
}

impl TcpGroup {
    /// Joins the group `r` describes: rank 0 listens and accepts the others (checking that each
    /// has the same world size and fingerprint), the others connect (retrying until the
    /// timeout, as rank 0 may start later).
    pub fn join(r: &Rendezvous) -> Result<TcpGroup, CollectiveError> {
        if r.rank >= r.world {
            return Err(CollectiveError::BadRank { rank: r.rank, world: r.world });
        }
        let deadline = Instant::now() + r.timeout;
        let hello = |rank: usize| {
            let mut h = MAGIC.to_vec();
            h.extend_from_slice(&(rank as u64).to_le_bytes());
            h.extend_from_slice(&(r.world as u64).to_le_bytes());
            h.extend_from_slice(&r.fingerprint.to_le_bytes());
            h
        };
        let configure = |s: &TcpStream| -> Result<(), CollectiveError> {
            s.set_nodelay(true).map_err(net("configuring a connection"))?;
            s.set_read_timeout(Some(r.timeout)).map_err(net("configuring a connection"))?;
            s.set_write_timeout(Some(r.timeout)).map_err(net("configuring a connection"))
        };
        let mut group =
            TcpGroup { rank: r.rank, world: r.world, timeout: r.timeout, peers: Vec::new() };
        if r.world == 1 {
            return Ok(group);
        }
        if r.rank == 0 {
            let listener = TcpListener::bind(&r.addr)
                .map_err(|e| net(&format!("listening on {}", r.addr))(e))?;
            listener.set_nonblocking(true).map_err(net("listening"))?;
            let mut by_rank: Vec<Option<TcpStream>> = (0..r.world).map(|_| None).collect();
            while by_rank[1..].iter().any(Option::is_none) {
                if Instant::now() >= deadline {
                    let rank = by_rank[1..].iter().position(Option::is_none).map_or(1, |p| p + 1);
                    return Err(CollectiveError::Timeout {
                        rank,
                        world: r.world,
                        seconds: r.timeout.as_secs_f64(),
                    });
                }
                let mut s = match listener.accept() {
                    Ok((s, _)) => s,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    Err(e) => return Err(net("accepting")(e)),
                };
                s.set_nonblocking(false).map_err(net("accepting"))?;
                configure(&s)?;
                let mut h = [0u8; 32];
                s.read_exact(&mut h).map_err(net("reading a rank's greeting"))?;
                let field = |k: usize| {
                    u64::from_le_bytes(h[8 + 8 * k..16 + 8 * k].try_into().unwrap_or_default())
                };
                let (rank, world, fingerprint) = (field(0) as usize, field(1) as usize, field(2));
                // The refused rank is told why, in the words rank 0 reports.
                let refuse = |s: &mut TcpStream, e: CollectiveError| {
                    let _ = write_frame(s, ABORT, e.to_string().as_bytes());
                    Err(e)
                };
                if &h[..8] != MAGIC {
                    return refuse(&mut s, CollectiveError::NotARank);
                }
                if world != r.world || fingerprint != r.fingerprint {
                    return refuse(
                        &mut s,
                        CollectiveError::Fingerprint {
                            rank,
                            world,
                            fingerprint,
                            ours_world: r.world,
                            ours_fingerprint: r.fingerprint,
                        },
                    );
                }
                if rank == 0 || rank >= r.world || by_rank[rank].is_some() {
                    return refuse(&mut s, CollectiveError::BadRank { rank, world: r.world });
                }
                write_frame(&mut s, DATA, b"ok").map_err(net("greeting a rank"))?;
                by_rank[rank] = Some(s);
            }
            group.peers = by_rank.into_iter().flatten().collect();
        } else {
            let addr: SocketAddr = std::net::ToSocketAddrs::to_socket_addrs(&r.addr)
                .map_err(|e| net(&format!("resolving {}", r.addr))(e))?
                .next()
                .ok_or_else(|| CollectiveError::NoAddress { addr: r.addr.clone() })?;
            let mut s = loop {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() >= deadline => {
                        return Err(CollectiveError::Unreachable {
                            rank: r.rank,
                            addr: r.addr.clone(),
                            seconds: r.timeout.as_secs_f64(),
                            detail: e.to_string(),
                        })
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            configure(&s)?;
            s.write_all(&hello(r.rank)).map_err(net("greeting rank 0"))?;
            match read_frame(&mut s) {
                Ok((DATA, _)) => {}
                Ok((_, why)) => {
                    return Err(CollectiveError::Refused(String::from_utf8_lossy(&why).into()))
                }
                Err(e) => return Err(peer_error(0, r.world, r.timeout, &e)),
            }
            group.peers = vec![s];
        }
        Ok(group)
    }
}

impl Collective for TcpGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let (world, timeout) = (self.world, self.timeout);
        if world == 1 {
            return Ok(vec![mine.to_vec()]);
        }
        if self.rank == 0 {
            let mut all = vec![mine.to_vec()];
            for (k, s) in self.peers.iter_mut().enumerate() {
                match read_frame(s) {
                    Ok((DATA, body)) => all.push(body),
                    Ok((_, why)) => {
                        let why = String::from_utf8_lossy(&why).into_owned();
                        return Err(CollectiveError::PeerLeft { rank: k + 1, why });
                    }
                    Err(e) => return Err(peer_error(k + 1, world, timeout, &e)),
                }
            }
            let body = encode_all(&all);
            for (k, s) in self.peers.iter_mut().enumerate() {
                write_frame(s, DATA, &body).map_err(|e| peer_error(k + 1, world, timeout, &e))?;
            }
            Ok(all)
        } else {
            let s = &mut self.peers[0];
            write_frame(s, DATA, mine).map_err(|e| peer_error(0, world, timeout, &e))?;
            match read_frame(s) {
                Ok((DATA, body)) => decode_all(&body, world)
                    .ok_or(CollectiveError::Malformed { rank: 0, what: "gather" }),
                Ok((_, why)) => {
                    let why = String::from_utf8_lossy(&why).into_owned();
                    // Rank 0 relays the rank that stopped in its message.
                    Err(CollectiveError::PeerLeft { rank: 0, why })
                }
                Err(e) => Err(peer_error(0, world, timeout, &e)),
            }
        }
    }

    fn abort(&mut self, why: &str) {
        let msg = format!("rank {} stopped: {why}", self.rank);
        for s in &mut self.peers {
            let _ = write_frame(s, ABORT, msg.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_all<C: Collective + 'static>(
        members: Vec<C>,
        f: impl Fn(&mut C) -> Result<Vec<f32>, CollectiveError> + Send + Sync + 'static,
    ) -> Vec<Result<Vec<f32>, CollectiveError>> {
        let f = Arc::new(f);
        let handles: Vec<_> = members
            .into_iter()
            .map(|mut m| {
                let f = Arc::clone(&f);
                std::thread::spawn(move || f(&mut m))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn sums<C: Collective>(m: &mut C) -> Result<Vec<f32>, CollectiveError> {
        let mut out = Vec::new();
        for round in 0..50 {
            let r = m.rank() as f32;
            let mut data = vec![r + round as f32, 1.0, 0.1 * r];
            m.all_reduce_sum(&mut data)?;
            out.extend(data);
        }
        Ok(out)
    }

    #[test]
    fn local_group_reduces_in_rank_order_on_every_rank() {
        let results = run_all(LocalGroup::new(3, Duration::from_secs(10)), sums);
        let first = results[0].as_ref().unwrap().clone();
        for r in &results {
            assert_eq!(r.as_ref().unwrap(), &first, "every rank gets the same bits");
        }
        assert_eq!(&first[..3], &[3.0, 3.0, 0.1f32 + 0.2f32]);
        assert_eq!(first[3 * 49], 3.0 + 3.0 * 49.0);
    }

    #[test]
    fn a_rank_that_stops_or_hangs_is_named() {
        let results = run_all(LocalGroup::new(3, Duration::from_secs(10)), |m| {
            if m.rank() == 2 {
                m.abort("out of data");
                return Ok(Vec::new());
            }
            sums(m)
        });
        for r in &results[..2] {
            let e = r.as_ref().unwrap_err();
            assert_eq!(e, &CollectiveError::PeerLeft { rank: 2, why: "out of data".into() });
        }
        let results = run_all(LocalGroup::new(2, Duration::from_millis(200)), |m| {
            if m.rank() == 1 {
                std::thread::sleep(Duration::from_millis(600));
                m.abort("late");
                return Ok(Vec::new());
            }
            sums(m)
        });
        let e = results[0].as_ref().unwrap_err().to_string();
        assert!(e.contains("rank 1 of 2") && e.contains("0.2 s"), "{e}");
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    #[test]
    fn tcp_group_agrees_with_the_local_group_and_refuses_strangers() {
        let addr = format!("127.0.0.1:{}", free_port());
        let rdv = |rank, fingerprint| Rendezvous {
            addr: addr.clone(),
            rank,
            world: 3,
            timeout: Duration::from_secs(10),
            fingerprint,
        };
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let r = rdv(rank, 7);
                std::thread::spawn(move || sums(&mut TcpGroup::join(&r)?))
            })
            .collect();
        let tcp: Vec<_> = handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        let local = run_all(LocalGroup::new(3, Duration::from_secs(10)), sums);
        for (t, l) in tcp.iter().zip(&local) {
            assert_eq!(t, l.as_ref().unwrap());
        }

        // A rank whose process dies mid-run (its connection closes): rank 0 names it, and
        // passes the news on to the others as rank_main does (abort on error).
        let addr3 = format!("127.0.0.1:{}", free_port());
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let r = Rendezvous { addr: addr3.clone(), ..rdv(rank, 7) };
                std::thread::spawn(move || {
                    let mut g = TcpGroup::join(&r)?;
                    for round in 0..10 {
                        if rank == 2 && round == 4 {
                            drop(g);
                            return Ok(());
                        }
                        let mut data = vec![1.0f32; 8];
                        if let Err(e) = g.all_reduce_sum(&mut data) {
                            g.abort(&e.to_string());
                            return Err(e);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let e0 = results[0].as_ref().unwrap_err().to_string();
        let e1 = results[1].as_ref().unwrap_err().to_string();
        assert!(e0.starts_with("rank 2 stopped"), "{e0}");
        assert!(e1.contains("rank 2 stopped"), "{e1}");

        // A rank with another fingerprint (config, corpus or binary) is refused, on both ends.
        let addr = format!("127.0.0.1:{}", free_port());
        let r0 = Rendezvous { addr: addr.clone(), world: 2, ..rdv(0, 1) };
        let r1 = Rendezvous { addr, world: 2, ..rdv(1, 2) };
        let h0 = std::thread::spawn(move || TcpGroup::join(&r0).map(|_| ()));
        let e1 = TcpGroup::join(&r1).unwrap_err();
        let e0 = h0.join().unwrap().unwrap_err();
        let want = CollectiveError::Fingerprint {
            rank: 1,
            world: 2,
            fingerprint: 2,
            ours_world: 2,
            ours_fingerprint: 1,
        };
        assert_eq!(e0, want);
        assert_eq!(e1, CollectiveError::Refused(want.to_string()));
    }
}

//! One engine call of the worker: continuous batching over one set of weights.
use super::*;

/// One engine call over one set of weights: the request that started it, the requests for the
/// same weights queued before the next reload, and those that arrive while it runs, until a job
/// for anything else is queued.
pub(super) struct Batch {
    pub(super) weights: Weights,
    pub(super) first: (Request, SampleReply),
    pub(super) linger: bool,
    pub(super) max_batch_rows: usize,
    pub(super) seed: u64,
}

impl Batch {
    pub(super) fn run(
        self,
        models: &mut Models,
        pending: &mut VecDeque<Job>,
        rx: &mpsc::Receiver<Job>,
    ) {
        let Batch {
            weights,
            first,
            linger,
            max_batch_rows,
            seed,
        } = self;
        // The queued requests for these weights join now, up to the first reload or weight push
        // (those after it must see the new weights).
        let mut initial = vec![first];
        let mut rest = VecDeque::new();
        let mut barrier = false;
        for job in pending.drain(..) {
            match job {
                Job::Sample {
                    weights: w,
                    request,
                    reply,
                } if !barrier && w == weights => initial.push((request, reply)),
                job => {
                    barrier |= matches!(job, Job::Reload { .. } | Job::ReceiveWeights { .. });
                    rest.push_back(job);
                }
            }
        }
        *pending = rest;
        let loaded: &Policy = match models.select(&weights) {
            Ok(l) => &l.policy,
            Err(e) => {
                let msg = format!("{e:#}");
                for (_, reply) in initial {
                    let _ = reply.send(Err(msg.clone()));
                }
                return;
            }
        };
        let mut engine =
            Engine::new(&loaded.model, loaded.eos_ids.clone()).with_config(EngineConfig {
                max_batch_rows,
                seed,
                ..EngineConfig::default()
            });
        if let Some(t) = &loaded.tokenizer {
            engine = engine.with_decoder(t);
        }
        // Replies by engine request index (the engine numbers requests in admission order from
        // 0), each removed once sent or its client is gone.
        let replies: RefCell<HashMap<usize, SampleReply>> = RefCell::new(HashMap::new());
        let mut admitted = 0;
        let mut initial = Some(initial);
        let mut linger_until = linger.then(|| std::time::Instant::now() + LINGER);
        let mut inbox = |idle: bool| -> Incoming {
            let mut requests = vec![];
            let mut admit = |request: Request, reply: SampleReply, requests: &mut Vec<Request>| {
                // A client that went away no longer needs its samples.
                if !reply.is_closed() {
                    replies.borrow_mut().insert(admitted, reply);
                    admitted += 1;
                    requests.push(request);
                }
            };
            for (request, reply) in initial.take().into_iter().flatten() {
                admit(request, reply, &mut requests);
            }
            // Something else waits: admit nothing more, finish what runs.
            while pending.is_empty() {
                // Block only when nothing is in flight and nothing was taken yet; then, starting
                // from idle, linger for the requests sent with the first.
                let job = if idle && requests.is_empty() {
                    let j = rx.recv().map_err(|_| mpsc::TryRecvError::Disconnected);
                    linger_until = Some(std::time::Instant::now() + LINGER);
                    j
                } else if let Some(until) = linger_until {
                    match rx
                        .recv_timeout(until.saturating_duration_since(std::time::Instant::now()))
                    {
                        Ok(j) => Ok(j),
                        Err(mpsc::RecvTimeoutError::Timeout) => Err(mpsc::TryRecvError::Empty),
                        Err(mpsc::RecvTimeoutError::Disconnected) => {
                            Err(mpsc::TryRecvError::Disconnected)
                        }
                    }
                } else {
                    rx.try_recv()
                };
                match job {
                    Ok(Job::Sample {
                        weights: w,
                        request,
                        reply,
                    }) if w == weights => admit(request, reply, &mut requests),
                    Ok(other) => pending.push_back(other),
                    Err(mpsc::TryRecvError::Empty) => break,
                    // The server is stopping: finish what runs (the loop then ends).
                    Err(mpsc::TryRecvError::Disconnected) => {
                        if requests.is_empty() {
                            return Incoming::Close;
                        }
                        break;
                    }
                }
            }
            linger_until = None;
            if requests.is_empty() && !pending.is_empty() {
                Incoming::Close
            } else {
                Incoming::Requests(requests)
            }
        };
        let mut done = |index: usize, result: Result<Vec<Sample>, String>| {
            if let Some(reply) = replies.borrow_mut().remove(&index) {
                let _ = reply.send(result);
            }
        };
        // A client that hung up mid-request: its request stops at the next step, so a client
        // that times out and retries does not leave the server decoding for nobody.
        let mut gone = |index: usize| {
            let mut replies = replies.borrow_mut();
            match replies.get(&index) {
                Some(reply) if reply.is_closed() => {
                    replies.remove(&index);
                    eprintln!("temper serve: a client went away mid-request; its request stopped");
                    true
                }
                Some(_) => false,
                None => true,
            }
        };
        // A panic inside the engine fails the requests in flight, not the server: the worker's
        // loop goes on with the next job.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.generate_continuous(&mut inbox, &mut done, &mut gone)
        }));
        drop(engine);
        let failure = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(panic) => Some(format!(
                "the request failed inside the server: {}",
                panic_message(&panic)
            )),
        };
        if let Some(msg) = failure {
            // The engine failed as a whole (not one request): every open request gets the error.
            for reply in replies.into_inner().into_values() {
                let _ = reply.send(Err(msg.clone()));
            }
        }
    }
}

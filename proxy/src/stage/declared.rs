//! What a stage's workers declared in their hellos ([`Declared`]: schemas, tensors, a weight
//! rule), and how the stage keeps it as workers come and go: the latest declaration of each part
//! wins ([`Declared::over`]); a newcomer whose tensors differ from those of connected workers is
//! refused ([`Stage::tensor_conflict`]); a part no connected worker declares any more is
//! forgotten as a newcomer joins ([`Parts`], [`Stage::forget_all_but`]), and as a worker leaves
//! the stage's are laid again from those of the workers still connected ([`Declarers`],
//! [`Stage::forget_departed`]). A worker's check, its declarations and its seat are one step
//! ([`Stage::joining`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use corral_protocol::TensorSpec;

use super::{Stage, WeightRule};

/// What the stage's workers declared in their hello: their inputs' and outputs' JSON Schemas
/// (parsed, for `/openapi.json`), their tensors (for Open Inference Protocol v2 clients), and
/// their weight rule (for the stage's batches).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Declared {
    pub input: Option<serde_json::Value>,
    pub output: Option<serde_json::Value>,
    pub components: serde_json::Map<String, serde_json::Value>,
    /// The worker that declared the schemas streams: its output schema is each chunk's, and a
    /// one-shot client gets an array of chunks (or the `ok` data, where the job sent none).
    pub chunks: bool,
    /// Each job's payload tensors, one row each; empty if the workers declared none.
    pub inputs: Vec<TensorSpec>,
    /// Each job's result tensors, one row each.
    pub outputs: Vec<TensorSpec>,
    /// How each job is weighed, when the workers declared a rule and the client gave no weight.
    pub weight: Option<WeightRule>,
}

impl Declared {
    /// Whether it holds tensors, inputs or outputs.
    pub fn declares_tensors(&self) -> bool {
        !self.inputs.is_empty() || !self.outputs.is_empty()
    }

    /// A hello's declarations laid over the stage's earlier ones, part by part: its schemas,
    /// tensors and weight rule each replace the earlier ones only if it declares them. A later
    /// worker that declared only schemas once wiped the weight rule an earlier one declared
    /// (PROTOCOL.md: "the latest hello that declares one wins").
    pub fn over(mut self, before: Option<&Declared>) -> Declared {
        let Some(before) = before else { return self };
        if self.input.is_none() && self.output.is_none() {
            self.input.clone_from(&before.input);
            self.output.clone_from(&before.output);
            self.components.clone_from(&before.components);
            self.chunks = before.chunks;
        }
        if !self.declares_tensors() {
            self.inputs.clone_from(&before.inputs);
            self.outputs.clone_from(&before.outputs);
        }
        if self.weight.is_none() {
            self.weight.clone_from(&before.weight);
        }
        self
    }
}

/// Which parts of the declarations a hello declared, or connected workers do: each is
/// forgotten ([`Stage::forget_all_but`]) once no connected worker declares it and a newcomer
/// declares none, or its last declaring worker leaves while others stay.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Parts {
    pub tensors: bool,
    pub schemas: bool,
    pub weight: bool,
}

impl Parts {
    /// The parts `declared` holds (none for None).
    pub fn of(declared: Option<&Declared>) -> Parts {
        let Some(d) = declared else { return Parts::default() };
        Parts {
            tensors: d.declares_tensors(),
            schemas: d.input.is_some() || d.output.is_some(),
            weight: d.weight.is_some(),
        }
    }

    /// The parts either holds.
    pub fn or(self, other: Parts) -> Parts {
        Parts {
            tensors: self.tensors || other.tensors,
            schemas: self.schemas || other.schemas,
            weight: self.weight || other.weight,
        }
    }
}

/// Each connected worker's own declarations (those that declared something), by seat, in the
/// order they joined.
#[derive(Debug, Default)]
pub struct Declarers {
    joins: u64,
    /// (seat, join number, its declarations)
    held: Vec<(usize, u64, Arc<Declared>)>,
}

impl Declarers {
    pub(super) fn joined(&mut self, seat: usize, declared: Arc<Declared>) {
        self.joins += 1;
        self.held.retain(|&(held, _, _)| held != seat);
        self.held.push((seat, self.joins, declared));
    }

    pub(super) fn left(&mut self, seat: usize) {
        self.held.retain(|&(held, _, _)| held != seat);
    }

    /// Their declarations laid over one another in the order they joined (None: none declared
    /// anything).
    fn laid(&self) -> Option<Declared> {
        let mut held: Vec<_> = self.held.iter().collect();
        held.sort_by_key(|&&(_, join, _)| join);
        held.into_iter().fold(None, |below, (_, _, declared)| {
            Some(Declared::clone(declared).over(below.as_ref()))
        })
    }
}

impl Stage {
    /// Keeps what a joining worker declared (None: nothing to keep; `parts`, what it holds) as
    /// the stage's newest: a part it lacks, that no connected worker declares, goes (its lack of
    /// tensors replaces the last ones' as a newcomer's tensors do, [`Stage::tensor_conflict`]).
    /// Called under [`Stage::joining`], before its seat is taken.
    pub fn keep(&self, declared: Option<Declared>, parts: Parts) {
        self.forget_all_but(parts.or(self.declaring()));
        if let Some(declared) = declared {
            self.declare(declared);
        }
    }

    /// After a worker left: where workers are still connected but none declares tensors (or
    /// schemas, or a weight rule), what the departed declared goes, as a newcomer declaring none
    /// takes it out ([`Stage::keep`]). A rolling update starts the new worker before the old one
    /// stops: its successor had joined while it was there, and its tensors stayed in force (v2
    /// and KServe v1 requests refused for inputs the workers left no longer take) and its
    /// schemas in `/openapi.json`. With no worker left, the next hello decides, as at a restart.
    /// The declarations are laid again from the workers still connected, in the order they
    /// joined: a part the departed declared last goes back to the one declared before it by a
    /// worker still there (a newer worker's weight rule, or schemas, had stayed in force after
    /// it left, over the rule of the older worker still serving).
    pub fn forget_departed(&self) {
        let _joining = self.joining();
        if self.workers() == 0 {
            return;
        }
        let laid = self.declarers().laid();
        let mut kept = self.declared.lock().unwrap_or_else(|p| p.into_inner());
        if kept.is_none() && laid.is_none() {
            return;
        }
        let laid = laid.unwrap_or_default();
        if kept.as_deref() == Some(&laid) {
            return; // the same declarations: `/openapi.json` is not built again
        }
        self.weighs.store(laid.weight.is_some(), Ordering::Relaxed);
        self.put(&mut kept, laid);
    }

    pub(super) fn declarers(&self) -> MutexGuard<'_, Declarers> {
        self.declarers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes out of the stage's declarations each part `kept` does not hold, the parts departed
    /// workers declared: with a worker joining alone declaring no tensors, a v1 instance had
    /// still been sent to it as the tensors of the worker it replaced (and v2's metadata listed
    /// them); a departed typed worker's schemas stayed required in `/openapi.json` of clients
    /// its untyped successor served; its weight rule weighed every job (items of its `/n`
    /// batched one by one, for a successor that never asked).
    pub fn forget_all_but(&self, kept: Parts) {
        let mut declarations = self.declared.lock().unwrap_or_else(|p| p.into_inner());
        let Some(declared) = declarations.as_ref() else { return };
        let held = Parts::of(Some(declared));
        let gone = |part: bool, keep: bool| part && !keep;
        let (tensors, schemas, weight) = (
            gone(held.tensors, kept.tensors),
            gone(held.schemas, kept.schemas),
            gone(held.weight, kept.weight),
        );
        if !(tensors || schemas || weight) {
            return; // the same declarations: `/openapi.json` is not built again
        }
        let mut without = Declared::clone(declared);
        if tensors {
            without.inputs.clear();
            without.outputs.clear();
        }
        if schemas {
            (without.input, without.output, without.chunks) = (None, None, false);
            without.components.clear();
        }
        if weight {
            without.weight = None;
            self.weighs.store(false, Ordering::Relaxed);
        }
        self.put(&mut declarations, without);
    }

    /// Puts `declared` in as the stage's declarations (`kept`, under its lock), moving the
    /// tensors' epoch on where its tensors are not those it replaces: rows queued already were
    /// read against the old ones ([`Stage::declared_marked`]).
    fn put(&self, kept: &mut Option<Arc<Declared>>, declared: Declared) {
        let before = kept.as_deref();
        let same = |b: &Declared| b.inputs == declared.inputs && b.outputs == declared.outputs;
        if !before.map_or(!declared.declares_tensors(), same) {
            self.tensors_epoch.fetch_add(1, Ordering::Relaxed);
        }
        *kept = Some(Arc::new(declared));
    }

    /// The stage's declarations, with the epoch of their tensors: a request whose rows are read
    /// against them marks its jobs with it (`Traffic::tensors`), and a job whose mark is not the
    /// stage's when it is taken for a batch is answered 503 `tensors_changed`
    /// ([`Stage::tensors_epoch`]). Read under one lock: the epoch is never newer than the
    /// tensors beside it.
    pub fn declared_marked(&self) -> (Option<Arc<Declared>>, u64) {
        let kept = self.declared.lock().unwrap_or_else(|p| p.into_inner());
        (kept.clone(), self.tensors_epoch.load(Ordering::Relaxed))
    }

    /// The epoch of the stage's declared tensors now: a job marked with another was read against
    /// tensors the stage no longer declares (a worker of other tensors, or none, replaced them
    /// while it was queued); sent on, it would reach that worker as rows of the old tensors.
    /// Read once per batch taken, not per job.
    pub fn tensors_epoch(&self) -> u64 {
        self.tensors_epoch.load(Ordering::Relaxed)
    }

    /// Held while a worker's hello is checked against the stage ([`Stage::tensor_conflict`]),
    /// its declarations kept and its seat taken: one step for every newcomer at a time. Two
    /// hellos on an empty stage had each seen no worker connected, and workers of different
    /// tensors served it together (v2 rows read for one reached the other: 18 races in 300).
    pub fn joining(&self) -> MutexGuard<'_, ()> {
        self.joining.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records what a worker declared, over what earlier ones did ([`Declared::over`]: the
    /// latest declaration of each part wins: workers of one stage are copies of one program).
    pub fn declare(&self, declared: Declared) {
        let mut kept = self.declared.lock().unwrap_or_else(|p| p.into_inner());
        let declared = declared.over(kept.as_deref());
        self.weighs.store(declared.weight.is_some(), Ordering::Relaxed);
        self.put(&mut kept, declared);
    }

    /// Why a hello declaring these tensors may not join, if it may not: while a connected
    /// worker serves the stage under other tensor declarations, a v2 request is read against
    /// one set and could reach a worker of the other (a row its hello did not take). With no
    /// worker connected that declared tensors, the newcomer's declarations replace what the
    /// last ones left (a worker declaring none, connected, had kept a departed worker's for
    /// good, and refused every other in their name).
    pub fn tensor_conflict(
        &self,
        inputs: &[corral_protocol::TensorSpec],
        outputs: &[corral_protocol::TensorSpec],
    ) -> Option<String> {
        let declaring = self.declaring_tensors();
        if (inputs.is_empty() && outputs.is_empty()) || declaring == 0 {
            return None;
        }
        let kept = self.declared()?;
        if !kept.declares_tensors() {
            return None;
        }
        if kept.inputs == inputs && kept.outputs == outputs {
            return None;
        }
        // The first few, each name quoted: another worker's words, and a shape of millions of
        // dimensions had been written out whole (4 bytes each).
        let named = |specs: &[corral_protocol::TensorSpec]| {
            let each = specs.iter().take(8).map(|t| {
                let dims = t.shape.iter().take(8).map(i64::to_string).collect::<Vec<_>>();
                let more = if t.shape.len() > 8 { ", …" } else { "" };
                format!("{:?} {} [{}{more}]", t.name, t.datatype, dims.join(", "))
            });
            let mut shown = each.collect::<Vec<_>>().join(", ");
            if specs.is_empty() {
                shown.push_str("none"); // not "outputs: )"
            }
            if specs.len() > 8 {
                shown.push_str(&format!(" and {} more", specs.len() - 8));
            }
            shown
        };
        Some(format!(
            "stage {:?} is served under other tensors (inputs: {}; outputs: {}) by the {} \
             worker(s) connected that declare them: a stage's workers must declare the same ones \
             (replace them all, or serve the new model as another stage)",
            self.name,
            named(&kept.inputs),
            named(&kept.outputs),
            declaring
        ))
    }

    /// Connected workers whose hello declared tensors: while there are none, a newcomer's
    /// tensors (or its lack of them) replace what the last ones left.
    pub fn declaring_tensors(&self) -> usize {
        self.lock().seats.iter().flatten().filter(|seat| seat.declares.tensors).count()
    }

    /// The parts some connected worker declared ([`Stage::forget_all_but`]).
    pub fn declaring(&self) -> Parts {
        let queue = self.lock();
        queue.seats.iter().flatten().fold(Parts::default(), |all, seat| all.or(seat.declares))
    }

    /// Whether what the stage's workers take is known: something was declared, or a worker
    /// connected declaring nothing (plain values). Not before the first worker connects (a
    /// model loading at start): a v2 or KServe v1 request then cannot be read against its
    /// tensors, and is answered 503 rather than queued unchecked. A plain worker restarting
    /// later keeps the stage known: its requests queue for it.
    pub fn declarations_known(&self) -> bool {
        self.joined_once.load(Ordering::Relaxed) || self.declared().is_some()
    }

    pub fn declared(&self) -> Option<Arc<Declared>> {
        self.declared.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::stage::{BatchSettings, Policy};

    #[test]
    fn a_departed_worker_s_weight_rule_leaves_with_it() {
        // Its successor joined first (a rolling update) and declares none: every job had gone
        // on being weighed by the departed worker's rule (its `/n`: items batched one by one).
        let stage = Stage::new("default", settings(), 100);
        let weighted = join(&stage, weighing("/n"));
        let _plain = join(&stage, Declared::default());
        assert!(stage.declared().unwrap().weight.is_some(), "kept while its worker is there");
        drop(weighted);
        stage.forget_departed();
        assert!(stage.declared().unwrap().weight.is_none());
    }

    #[test]
    fn a_departed_worker_s_rule_gives_way_to_the_one_before_it_of_a_worker_still_there() {
        // An older worker weighs by `/b`; a newer one by `/a` (a rollback started and stopped
        // it, say), its schemas its own. Once it leaves, `/b` weighs the jobs again and the
        // older worker's schemas are `/openapi.json`'s: its rule and schemas had stayed.
        let stage = Stage::new("default", settings(), 100);
        let schema = |title: &str| Some(serde_json::json!({"title": title}));
        let older = Declared { input: schema("older"), ..weighing("/b") };
        let _older = join(&stage, older);
        let newer = join(&stage, Declared { input: schema("newer"), ..weighing("/a") });
        let rule = |stage: &Stage| stage.declared().unwrap().weight.clone();
        assert_eq!(rule(&stage), Some(WeightRule::parse("/a").unwrap()));
        drop(newer);
        stage.forget_departed();
        assert_eq!(rule(&stage), Some(WeightRule::parse("/b").unwrap()));
        assert_eq!(stage.declared().unwrap().input, schema("older"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_row_read_against_tensors_a_newcomer_replaced_is_answered_not_sent() {
        // The last worker of tensors `x` left with a v2 row queued, read against them; one of
        // tensors `y` joined: the row had reached it as a row of `x`. Now it is answered 503
        // `tensors_changed`, and a row read against `y` goes.
        let stage = Stage::new("default", settings(), 100);
        let old = join(&stage, tensors("x"));
        let (_, read) = stage.declared_marked();
        let (stale, mut stale_answer) = marked(read);
        stage.submit(stale).unwrap();
        drop(old);
        stage.forget_departed();
        let _new = join(&stage, tensors("y"));
        let (_, now) = stage.declared_marked();
        assert_ne!(read, now, "other tensors, another epoch");
        let (fresh, _fresh_answer) = marked(now);
        stage.submit(fresh).unwrap();
        let batch = stage.next_batch().await;
        assert_eq!(batch.iter().map(|job| job.tensors).collect::<Vec<_>>(), [Some(now)]);
        let outcome = stale_answer.try_recv().unwrap().outcome;
        assert_eq!(outcome, crate::job::Outcome::TensorsChanged);
    }

    #[test]
    fn the_epoch_moves_only_when_the_tensors_change() {
        // A newcomer of the same tensors, new schemas or a weight rule leave queued rows as they
        // were read; a worker declaring none, joining alone, clears the tensors: rows read
        // against them would reach it as rows of tensors it does not take.
        let stage = Stage::new("default", settings(), 100);
        let epoch = |stage: &Stage| stage.declared_marked().1;
        let first = join(&stage, tensors("x"));
        let read = epoch(&stage);
        let _same = join(&stage, Declared { input: Some(serde_json::json!({})), ..tensors("x") });
        let _weighs = join(&stage, weighing("/n"));
        assert_eq!(epoch(&stage), read);
        drop((first, _same, _weighs));
        stage.forget_departed();
        let _plain = join(&stage, Declared::default());
        assert_ne!(epoch(&stage), read);
    }

    fn tensors(name: &str) -> Declared {
        let spec = |name: &str| corral_protocol::TensorSpec {
            name: name.into(),
            datatype: "FP32".into(),
            shape: vec![2],
        };
        Declared { inputs: vec![spec(name)], outputs: vec![spec("out")], ..Declared::default() }
    }

    /// A job whose row was read against the tensors of `epoch`.
    fn marked(epoch: u64) -> (crate::job::Job, tokio::sync::oneshot::Receiver<crate::job::Reply>) {
        let now = tokio::time::Instant::now();
        let deadline = now + Duration::from_secs(5);
        let (mut job, answer) =
            crate::job::Job::new(corral_protocol::JobId::new(), &b"\x80"[..], now, deadline);
        job.tensors = Some(epoch);
        (job, answer)
    }

    fn settings() -> BatchSettings {
        BatchSettings {
            max_batch_size: 8,
            max_wait: Duration::ZERO,
            max_batch_bytes: 1 << 20,
            max_job_bytes: 1 << 20,
            max_batch_weight: Some(10),
            policy: Policy::Fixed,
            prefetch: false,
            batch_timeout: None,
        }
    }

    fn weighing(rule: &str) -> Declared {
        Declared { weight: Some(WeightRule::parse(rule).unwrap()), ..Declared::default() }
    }

    /// A worker joining `stage` with these declarations, as a connection's hello does.
    fn join(stage: &Stage, declared: Declared) -> crate::stage::WorkerSeat<'_> {
        let parts = Parts::of(Some(&declared));
        let own = (parts != Parts::default()).then(|| Arc::new(declared.clone()));
        stage.keep(Some(declared), parts);
        let seat = stage.worker_joined();
        seat.declares(parts, own);
        seat
    }
}

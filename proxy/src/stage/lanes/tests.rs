//! The lanes' order on plain jobs: classes, tenants, requests kept whole, promotion, eviction.

use std::time::Duration;

use bytes::Bytes;
use corral_protocol::JobId;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;
use crate::job::Reply;

/// A job named by its payload, of a class, tenant and weight, arrived at `at`.
fn job(name: &str, class: Class, tenant: Option<&str>, weight: u32, at: Instant) -> Job {
    let (mut job, _): (Job, oneshot::Receiver<Reply>) =
        Job::new(JobId::new(), Bytes::copy_from_slice(name.as_bytes()), at, at + SECOND * 30);
    job.class = class;
    job.tenant = tenant.map(|t| Tenant::of(t.as_bytes()));
    job.weight = weight;
    job
}

const SECOND: Duration = Duration::from_secs(1);

fn names(jobs: impl IntoIterator<Item = Job>) -> Vec<String> {
    jobs.into_iter().map(|j| String::from_utf8(j.payload.contiguous().to_vec()).unwrap()).collect()
}

fn drain(lanes: &mut Lanes) -> Vec<String> {
    names(std::iter::from_fn(|| lanes.pop(true)))
}

fn one(lanes: &mut Lanes, name: &str, class: Class, tenant: Option<&str>, at: Instant) {
    lanes.push(vec![job(name, class, tenant, 1, at)], at);
}

#[test]
fn higher_classes_go_first_and_each_class_in_arrival_order() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    one(&mut lanes, "low1", Class::Low, None, now);
    one(&mut lanes, "normal1", Class::Normal, None, now);
    one(&mut lanes, "high1", Class::High, None, now);
    one(&mut lanes, "low2", Class::Low, None, now);
    one(&mut lanes, "high2", Class::High, None, now);
    assert_eq!(lanes.jobs_in(Class::Low), 2);
    assert_eq!(lanes.weight_from(Class::Normal), 3);
    assert_eq!(drain(&mut lanes), ["high1", "high2", "normal1", "low1", "low2"]);
    assert!(lanes.is_empty());
}

#[test]
fn tenants_take_turns_within_a_class() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    for i in 0..5 {
        one(&mut lanes, &format!("a{i}"), Class::Normal, Some("a"), now);
    }
    one(&mut lanes, "b0", Class::Normal, Some("b"), now);
    one(&mut lanes, "b1", Class::Normal, Some("b"), now);
    one(&mut lanes, "none0", Class::Normal, None, now);
    let order = drain(&mut lanes);
    // Within the first three picks every tenant (and the nameless lane) has had a turn.
    let first: Vec<&str> = order[..3].iter().map(|n| &n[..1]).collect();
    assert!(first.contains(&"a") && first.contains(&"b") && first.contains(&"n"), "{order:?}");
    assert_eq!(&order[5..], ["a2", "a3", "a4"]);
}

#[test]
fn turns_are_fair_in_weight_not_in_jobs() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    for i in 0..4 {
        lanes.push(vec![job(&format!("heavy{i}"), Class::Normal, Some("h"), 10, now)], now);
    }
    for i in 0..20 {
        lanes.push(vec![job(&format!("light{i}"), Class::Normal, Some("l"), 1, now)], now);
    }
    let order = drain(&mut lanes);
    // After the first heavy job (10), the light tenant catches up with ten of its own.
    let heavy_at: Vec<usize> =
        order.iter().enumerate().filter(|(_, n)| n.starts_with("heavy")).map(|(i, _)| i).collect();
    assert!(heavy_at[1] >= 10, "{order:?}");
}

#[test]
fn tenants_served_alike_go_in_the_order_they_came() {
    // A tenant per user, one request each, a newcomer after every job taken: each newcomer
    // starts level with those waiting, behind them. Ties had gone by the tenants' hashes, and
    // those with a larger one were passed by newcomer after newcomer until they expired.
    let now = Instant::now();
    let mut lanes = Lanes::default();
    for i in 0..10 {
        one(&mut lanes, &format!("waiting{i}"), Class::Normal, Some(&format!("w{i}")), now);
    }
    let mut order = Vec::new();
    for i in 0..20 {
        order.extend(names(lanes.pop(true)));
        lanes.end_batch();
        one(&mut lanes, &format!("new{i}"), Class::Normal, Some(&format!("n{i}")), now);
    }
    let waiting: Vec<String> = (0..10).map(|i| format!("waiting{i}")).collect();
    let newcomers: Vec<String> = (0..10).map(|i| format!("new{i}")).collect();
    assert_eq!(order[..10], waiting[..], "{order:?}");
    assert_eq!(order[10..], newcomers[..], "{order:?}");
}

#[test]
fn a_returning_tenant_gets_no_credit_for_its_idle_time() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    for i in 0..10 {
        one(&mut lanes, &format!("a{i}"), Class::Normal, Some("a"), now);
    }
    for _ in 0..8 {
        lanes.pop(true);
    }
    for i in 0..4 {
        one(&mut lanes, &format!("b{i}"), Class::Normal, Some("b"), now);
    }
    // b starts level with a, not 8 jobs behind: they alternate.
    let order = drain(&mut lanes);
    let tenants: String = order.iter().map(|n| &n[..1]).collect();
    assert!(tenants.starts_with("ab") || tenants.starts_with("ba"), "{order:?}");
    assert!(tenants[..4].contains('a') && tenants[..4].contains('b'), "{order:?}");
}

#[test]
fn a_requests_jobs_stay_together_across_tenants() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    let group = (0..3).map(|i| job(&format!("g{i}"), Class::Normal, Some("a"), 1, now)).collect();
    lanes.push(group, now);
    one(&mut lanes, "b0", Class::Normal, Some("b"), now);
    let order = drain(&mut lanes);
    let g = order.iter().position(|n| n == "g0").unwrap();
    assert_eq!(&order[g..g + 3], ["g0", "g1", "g2"], "{order:?}");
}

#[test]
fn waiting_promotes_one_class_per_period() {
    let start = Instant::now();
    let aging = SECOND;
    let mut lanes = Lanes::default();
    // The high job holds the low one back from when it came.
    one(&mut lanes, "old-low", Class::Low, None, start);
    one(&mut lanes, "high", Class::High, None, start + SECOND / 4);
    lanes.promote(start + SECOND, aging);
    assert_eq!(lanes.jobs_in(Class::Low), 1);
    lanes.promote(start + SECOND * 5 / 4, aging);
    assert_eq!((lanes.jobs_in(Class::Low), lanes.jobs_in(Class::Normal)), (0, 1));
    lanes.promote(start + SECOND * 9 / 4, aging);
    assert_eq!(lanes.jobs_in(Class::High), 2);
    assert_eq!(lanes.front().unwrap().class, Class::High);
    // Once high, it goes in the order it entered the class: after the high job queued before.
    assert_eq!(drain(&mut lanes), ["high", "old-low"]);
}

#[test]
fn a_tenant_s_backlog_its_class_is_served_from_is_not_promoted_past_another_tenant() {
    // Tenant A queued 20 normal requests; its class was served all along (each batch took one
    // of them), no higher work queued. Aging 0.4 s: A's backlog had moved up to high as it
    // aged behind itself, and B's fresh request waited behind all of it (admission refused B's
    // 1 s deadline: 503). Waiting behind one's own class is not starvation: none moves up, and
    // B takes its turn.
    let start = Instant::now();
    let aging = SECOND * 2 / 5;
    let mut lanes = Lanes::default();
    for i in 0..20 {
        one(&mut lanes, &format!("a{i}"), Class::Normal, Some("A"), start);
    }
    let now = start + SECOND * 2;
    one(&mut lanes, "b", Class::Normal, Some("B"), now);
    lanes.promote(now, aging);
    assert_eq!(lanes.jobs_in(Class::High), 0);
    assert_eq!(names([lanes.pop(true).unwrap(), lanes.pop(true).unwrap()]), ["a0", "b"]);
    lanes.taken(now, Some(Class::Low));
    // Held back by a higher class from when its work came, it climbs as before.
    one(&mut lanes, "h", Class::High, None, now);
    lanes.promote(now + aging, aging);
    assert_eq!(lanes.jobs_in(Class::High), 1 + 19);
}

#[test]
fn a_class_waiting_only_for_a_busy_worker_is_not_held_back() {
    // Low requests behind a slow batch of low ones, nothing higher queued: a slow first stage
    // had sent every low request that queued there into the next stage as high.
    let start = Instant::now();
    let aging = SECOND;
    let mut lanes = Lanes::default();
    one(&mut lanes, "taken", Class::Low, None, start);
    one(&mut lanes, "waits", Class::Low, None, start);
    assert_eq!(names([lanes.pop(true).unwrap()]), ["taken"]);
    lanes.taken(start, Some(Class::Low));
    lanes.promote(start + aging * 5, aging);
    assert_eq!(lanes.jobs_in(Class::Low), 1, "not held back: the worker is busy with its class");
    // A batch of higher work that leaves it out holds it back from then.
    one(&mut lanes, "high", Class::High, None, start + aging * 5);
    assert_eq!(names([lanes.pop(true).unwrap()]), ["high"]);
    lanes.taken(start + aging * 5, Some(Class::High));
    lanes.promote(start + aging * 6, aging);
    assert_eq!(lanes.jobs_in(Class::Normal), 1, "held back a period by the high batch");
}

/// Eight high jobs queued at `start`, and a batch of four of them taken then (nothing left out).
fn eight_high_and_a_batch_of_them_taken(start: Instant) -> Lanes {
    let mut lanes = Lanes::default();
    for i in 0..8 {
        one(&mut lanes, &format!("h{i}"), Class::High, None, start);
    }
    high_batch(&mut lanes, start);
    lanes
}

/// A batch of four high jobs taken at `at`, whatever it left out.
fn high_batch(lanes: &mut Lanes, at: Instant) {
    for _ in 0..4 {
        assert_eq!(lanes.pop(true).unwrap().class, Class::High);
    }
    lanes.taken(at, Some(Class::High));
}

#[test]
fn a_request_that_comes_into_an_empty_class_under_queued_higher_work_ages_from_then() {
    // The class was empty when the last batch went; high work stayed queued: the low request
    // that came is held back from its arrival (its clock had waited for the next batch).
    let start = Instant::now();
    let aging = SECOND;
    let mut lanes = eight_high_and_a_batch_of_them_taken(start);
    one(&mut lanes, "low", Class::Low, None, start + SECOND / 10);
    lanes.promote(start + SECOND / 10 + aging * 2, aging);
    assert_eq!(lanes.jobs_in(Class::High), 5, "promoted twice while the high jobs waited");
}

#[test]
fn what_a_batch_left_out_holds_nothing_back_once_it_is_gone() {
    // A high batch left a low job out; its client left. A low request that comes after, with
    // nothing higher queued, waits for the busy worker only: it had aged all the same.
    let start = Instant::now();
    let aging = SECOND;
    let mut lanes = Lanes::default();
    one(&mut lanes, "high", Class::High, None, start);
    one(&mut lanes, "gone", Class::Low, None, start);
    assert_eq!(names([lanes.pop(true).unwrap()]), ["high"]);
    lanes.taken(start, Some(Class::High));
    assert_eq!(names(lanes.remove_dead(|_| true)), ["gone"]);
    one(&mut lanes, "later", Class::Low, None, start + SECOND);
    lanes.promote(start + aging * 5, aging);
    assert_eq!(lanes.jobs_in(Class::Low), 1);
}

#[test]
fn the_batch_that_takes_the_last_higher_job_does_not_restart_the_clock_of_one_it_leaves_out() {
    let start = Instant::now();
    let aging = SECOND;
    let mut lanes = eight_high_and_a_batch_of_them_taken(start);
    one(&mut lanes, "low", Class::Low, None, start + SECOND / 10);
    // The next batch takes the last high jobs and leaves it out: held from its arrival still.
    high_batch(&mut lanes, start + SECOND * 9 / 10);
    lanes.promote(start + SECOND / 10 + aging * 2, aging);
    assert_eq!(lanes.jobs_in(Class::High), 1, "held back from its arrival, not the batch");
}

#[test]
fn a_promotion_out_of_the_class_above_does_not_restart_the_clock_below() {
    // A high batch left a normal job out (low empty); a low one came at 1 s, held back by it.
    // The normal job's promotion to high at 5 s (aging 4 s) had restarted the low clock there.
    let start = Instant::now();
    let aging = SECOND * 4;
    let mut lanes = Lanes::default();
    one(&mut lanes, "high", Class::High, None, start);
    one(&mut lanes, "normal", Class::Normal, None, start);
    assert_eq!(names([lanes.pop(true).unwrap()]), ["high"]);
    lanes.taken(start, Some(Class::High));
    one(&mut lanes, "low", Class::Low, None, start + SECOND);
    lanes.promote(start + SECOND * 5, aging);
    assert_eq!(lanes.jobs_in(Class::High), 1, "the normal job, due at 4 s");
    lanes.promote(start + SECOND * 5, aging);
    assert_eq!(lanes.jobs_in(Class::Normal), 1, "the low one, held back from 1 s");
}

#[test]
fn a_long_overdue_job_climbs_several_classes_at_once() {
    let start = Instant::now();
    let mut lanes = Lanes::default();
    one(&mut lanes, "high", Class::High, Some("h"), start);
    one(&mut lanes, "low", Class::Low, Some("t"), start);
    one(&mut lanes, "normal", Class::Normal, Some("t"), start + SECOND * 10);
    lanes.promote(start + SECOND * 10, SECOND);
    assert_eq!(lanes.jobs_in(Class::High), 2);
    assert_eq!(lanes.jobs_in(Class::Normal), 1);
    assert_eq!(drain(&mut lanes), ["high", "low", "normal"]);
}

#[test]
fn eviction_takes_the_lowest_class_latest_deadline_first() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    one(&mut lanes, "normal", Class::Normal, None, now + SECOND * 9);
    one(&mut lanes, "low-early", Class::Low, Some("a"), now);
    one(&mut lanes, "low-late", Class::Low, Some("b"), now + SECOND * 5);
    assert_eq!(lanes.below(Class::High), (3, lanes.bytes()));
    assert_eq!(names(lanes.evict_below(Class::High).unwrap()), ["low-late"]);
    assert_eq!(names(lanes.evict_below(Class::High).unwrap()), ["low-early"]);
    assert_eq!(names(lanes.evict_below(Class::High).unwrap()), ["normal"]);
    assert!(lanes.evict_below(Class::High).is_none());
    one(&mut lanes, "low", Class::Low, None, now);
    assert!(lanes.evict_below(Class::Low).is_none(), "nothing is below low");
    // Equal deadlines, entered at once: the later queued goes (as under paused time).
    one(&mut lanes, "tie-later", Class::Low, None, now);
    assert_eq!(names(lanes.evict_below(Class::High).unwrap()), ["tie-later"]);
}

#[test]
fn many_evicted_at_once_go_lowest_class_latest_deadline_first_and_the_rest_stay() {
    let now = Instant::now();
    // Deadlines out of queue order (all distinct), tenants interleaved, two classes below high.
    let class = |i: usize| if i.is_multiple_of(5) { Class::Normal } else { Class::Low };
    let deadline = |i: usize| (i * 7 % 40) as u32;
    let mut lanes = Lanes::default();
    for i in 0..40 {
        let tenant = ["a", "b", "c"][i % 3];
        one(&mut lanes, &format!("j{i}"), class(i), Some(tenant), now + SECOND * deadline(i));
    }
    let mut expected: Vec<usize> = (0..40).collect();
    expected.sort_by_key(|&i| (class(i), std::cmp::Reverse(deadline(i))));
    let expected: Vec<String> = expected[..25].iter().map(|i| format!("j{i}")).collect();
    let evicted = lanes.evict_below_while(Class::High, |jobs, _| jobs > 15);
    let evicted: Vec<String> = evicted.into_iter().flat_map(names).collect();
    assert_eq!(evicted, expected);
    assert_eq!(lanes.len(), 15);
    let kept: Vec<String> =
        (0..40).map(|i| format!("j{i}")).filter(|n| !expected.contains(n)).collect();
    let mut left = drain(&mut lanes);
    left.sort_by_key(|n| n[1..].parse::<usize>().unwrap());
    assert_eq!(left, kept);
    // Nothing to make room for: nothing goes.
    assert!(lanes.evict_below_while(Class::High, |_, _| false).is_empty());
}

#[test]
fn thirty_thousand_evicted_at_once_leave_the_counts_right() {
    // The size a queue of tens of thousands holds (one scan per victim had taken 12 s here).
    let now = Instant::now();
    let mut lanes = Lanes::default();
    for i in 0..30_000u32 {
        let tenant = ["a", "b", "c", "d"][i as usize % 4];
        one(&mut lanes, &format!("j{i}"), Class::Low, Some(tenant), now + SECOND * (i % 97));
    }
    one(&mut lanes, "normal", Class::Normal, None, now);
    let evicted = lanes.evict_below_while(Class::High, |jobs, _| jobs > 1);
    assert_eq!(evicted.len(), 30_000);
    assert_eq!((lanes.len(), lanes.jobs_in(Class::Low)), (1, 0));
    for tenant in ["a", "b", "c", "d"] {
        assert_eq!(lanes.of_tenant(Tenant::of(tenant.as_bytes())), 0);
    }
    assert_eq!(drain(&mut lanes), ["normal"]);
}

#[test]
fn a_whole_request_is_evicted_and_counts_follow() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    let group = (0..3).map(|i| job(&format!("g{i}"), Class::Low, Some("a"), 2, now)).collect();
    lanes.push(group, now);
    assert_eq!((lanes.len(), lanes.weight(), lanes.of_tenant(Tenant::of(b"a"))), (3, 6, 3));
    assert_eq!(names(lanes.evict_below(Class::Normal).unwrap()), ["g0", "g1", "g2"]);
    assert_eq!((lanes.len(), lanes.weight(), lanes.bytes()), (0, 0, 0));
    assert_eq!(lanes.of_tenant(Tenant::of(b"a")), 0);
}

#[test]
fn requeued_jobs_go_first_in_their_lane() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    one(&mut lanes, "queued", Class::Normal, None, now);
    lanes.push_front(vec![job("retried", Class::Normal, None, 1, now)], now);
    assert_eq!(drain(&mut lanes), ["retried", "queued"]);
}

#[test]
fn a_request_put_back_does_not_hold_back_the_promotion_of_older_ones() {
    // Queued at 0 s; a request put back before it at 4 s. At 5 s (aging 5 s) the queued one is
    // due: it was promoted only at 9 s, once the one put back at the front had aged too.
    let start = Instant::now();
    let aging = SECOND * 5;
    let mut lanes = Lanes::default();
    one(&mut lanes, "high", Class::High, Some("h"), start);
    one(&mut lanes, "queued", Class::Low, Some("t"), start);
    let back = start + SECOND * 4;
    lanes.push_front(vec![job("put back", Class::Low, Some("t"), 1, back)], back);
    lanes.promote(start + aging, aging);
    assert_eq!(lanes.jobs_in(Class::Low), 0);
    assert_eq!(drain(&mut lanes), ["high", "put back", "queued"]);
}

#[test]
fn dead_jobs_are_removed_wherever_they_wait() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    for (name, class, tenant) in
        [("a", Class::High, Some("x")), ("dead1", Class::Low, None), ("b", Class::Low, Some("y"))]
    {
        one(&mut lanes, name, class, tenant, now);
    }
    lanes.push(
        vec![job("c", Class::Normal, None, 1, now), job("dead2", Class::Normal, None, 4, now)],
        now,
    );
    let gone = lanes.remove_dead(|job| job.payload.contiguous().starts_with(b"dead"));
    assert_eq!(names(gone), ["dead2", "dead1"]);
    assert_eq!((lanes.len(), lanes.weight()), (3, 3));
    assert_eq!(drain(&mut lanes), ["a", "c", "b"]);
}

#[test]
fn the_oldest_job_and_the_earliest_deadline_look_across_lanes() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    one(&mut lanes, "new-high", Class::High, None, now + SECOND);
    one(&mut lanes, "old-low", Class::Low, Some("t"), now);
    assert_eq!(&lanes.oldest().unwrap().payload.contiguous()[..], b"old-low");
    // One job to go: only the high one can be in it.
    assert_eq!(lanes.earliest_deadline(1), Some(now + SECOND * 31));
    assert_eq!(lanes.earliest_deadline(2), Some(now + SECOND * 30));
}

#[test]
fn a_request_of_many_jobs_does_not_hold_the_next_batch() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    let flood = (0..6).map(|i| job(&format!("a{i}"), Class::Normal, Some("a"), 1, now)).collect();
    lanes.push(flood, now);
    one(&mut lanes, "b0", Class::Normal, Some("b"), now);
    // Whichever tenant goes first, a batch that started the flood keeps taking it...
    let mut first: Vec<String> = Vec::new();
    while first.len() < 3 {
        first.extend(names(lanes.pop(true)));
    }
    lanes.end_batch();
    // ...but the next batch begins with whoever has been served least.
    let next = names(lanes.pop(true)).pop().unwrap();
    assert!(first.contains(&"b0".to_string()) || next == "b0", "{first:?} then {next}");
}

#[test]
fn a_request_whose_job_was_buried_can_still_be_evicted_and_one_a_batch_took_cannot() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    let request = crate::job::new_request();
    let two = |first: &str, second: &str| {
        [first, second].map(|name| {
            let mut job = job(name, Class::Low, None, 1, now);
            job.request = request;
            job
        })
    };
    // Its first job taken to be buried (expired, abandoned), not dispatched: no batch started
    // the request, and it is still room for a higher class (it had been kept for good).
    lanes.push(two("buried", "left").into(), now);
    assert_eq!(names(lanes.pop(false)), ["buried"]);
    assert_eq!(lanes.below(Class::High).0, 1);
    assert_eq!(names(lanes.evict_below(Class::High).unwrap()), ["left"]);
    // Its first job dispatched: the rest is under way, neither room nor evicted.
    lanes.push(two("sent", "rest").into(), now);
    assert_eq!(names(lanes.pop(true)), ["sent"]);
    assert_eq!(lanes.below(Class::High).0, 0);
    assert!(lanes.evict_below(Class::High).is_none());
}

#[test]
fn a_new_tenant_has_one_turn_of_each_other_tenant_before_it_not_their_backlog() {
    let now = Instant::now();
    let mut lanes = Lanes::default();
    for i in 0..300 {
        one(&mut lanes, &format!("a{i}"), Class::Normal, Some("a"), now);
    }
    one(&mut lanes, "high", Class::High, None, now);
    let b = Some(Tenant::of(b"b"));
    // The high job, then one of a's for b's one, and a batch (of 8) a's may fill first: not
    // a's 300.
    assert_eq!(lanes.weight_before(Class::Normal, b, 1, 8), 1 + 9);
    // A request of 3 waits for 3 of a's, and that batch.
    assert_eq!(lanes.weight_before(Class::Normal, b, 3, 8), 1 + 11);
    // a itself waits for its own backlog.
    let a = Some(Tenant::of(b"a"));
    assert_eq!(lanes.weight_before(Class::Normal, a, 1, 8), 301);
    // With b holding work, a's job waits as long for b's turns as for its own queue: b may
    // keep sending all the while (more than the 5 it holds).
    for i in 0..5 {
        one(&mut lanes, &format!("b{i}"), Class::Normal, Some("b"), now);
    }
    assert_eq!(lanes.weight_before(Class::Normal, a, 1, 8), 1 + 300 + 300);
    // A new tenant's request of 32 rows beside ten tenants of one job each: its first batch is
    // not split by their turns, so they count as what they hold, not 32 each.
    let mut crowd = Lanes::default();
    for t in 0..10 {
        one(&mut crowd, "one", Class::Normal, Some(&format!("t{t}")), now);
    }
    assert_eq!(crowd.weight_before(Class::Normal, Some(Tenant::of(b"new")), 32, 32), 10);
    lanes.remove_dead(|job| job.tenant == b);
    // And the turns bear it out: b's job goes within the first two normal ones.
    one(&mut lanes, "b0", Class::Normal, Some("b"), now);
    assert!(drain(&mut lanes)[..3].contains(&"b0".to_string()));
}

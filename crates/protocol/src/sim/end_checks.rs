//! The checks at the end of a simulated run (the last invariants listed in `checks.rs`): every
//! record processed, every epoch done, every key's state where its location says, every task
//! exited by its protocol's rule, every consumer finished.

use super::checks::show;
use super::world::{Core, World};
use crate::control::Protocol;

impl World {
    /// Checks the world after its last step.
    pub(crate) fn check_end(&mut self) -> Result<(), String> {
        if self.processed_total != self.emitted_total {
            return Err(format!(
                "exactly once: {} of {} records processed",
                self.processed_total, self.emitted_total
            ));
        }
        if self.engine.running().is_some() || self.stats.epochs == 0 {
            let stuck: Vec<String> =
                self.tasks.iter().filter(|(_, t)| t.core.busy()).map(|(id, _)| format!("{id}")).collect();
            return Err(format!(
                "reconfiguration did not complete ({} epochs done, waiting for {:?}); busy tasks {stuck:?}",
                self.stats.epochs,
                self.engine.waiting_for()
            ));
        }
        for (id, t) in &self.tasks {
            if t.core.busy() {
                return Err(format!("{id} still in transition or holding records at the end"));
            }
            // Every upstream ended, so event time must have reached the end of time at each owner.
            let owns = self.claims.contains(&Some(*id));
            if owns && t.last_watermark != Some(u64::MAX) {
                return Err(format!(
                    "event time of {id} stuck at {:?} after end of stream",
                    t.last_watermark
                ));
            }
        }
        // Koala: every task reported `InputsEnded` and was released, so the runtime's would exit.
        if let Some((id, t)) =
            self.tasks.iter().find(|(_, t)| matches!(t.core, Core::Koala(_)) && !t.life.may_exit())
        {
            let all: Vec<String> = self
                .tasks
                .iter()
                .map(|(id, t)| {
                    format!("{id}: ended {} released {}", t.life.inputs_ended(), t.life.released())
                })
                .collect();
            return Err(format!(
                "exit: {id} would never exit (inputs ended: {}, released: {}; {all:?})",
                t.life.inputs_ended(),
                t.life.released()
            ));
        }
        // Stop-and-restart and Remote: every task exited by the runtime's rule once its inputs
        // ended and its part of every reconfiguration was done.
        if let Some((id, t)) =
            self.tasks.iter().find(|(_, t)| matches!(t.core, Core::StopAndRestart(..)) && !t.gone)
        {
            return Err(format!(
                "exit: {id} would never exit (inputs ended: {}, released: {})",
                t.life.inputs_ended(),
                t.life.released()
            ));
        }
        // DRRS: every task exited by the runtime's rule (`DrrsLife::may_exit`).
        if let Some((id, t)) = self.tasks.iter().find(|(_, t)| matches!(t.core, Core::Drrs(_)) && !t.gone) {
            return Err(format!(
                "exit: DRRS task {id} would never exit (inputs ended: {}, released: {}, taking part: {}, unstarted: {})",
                t.drrs.inputs_ended(),
                t.drrs.released(),
                t.drrs.taking_part(),
                t.drrs.unstarted()
            ));
        }
        if let Some((id, t)) = self.tasks.iter().find(|(_, t)| !t.timers.is_empty()) {
            return Err(format!("timers: {id} ends with {} unfired timers", t.timers.len()));
        }
        if let Some((id, t)) = self.tasks.iter().find(|(_, t)| !t.aside.is_empty()) {
            return Err(format!(
                "timers: {id} ends with {} timers set aside and never pushed",
                t.aside.len()
            ));
        }
        if !self.paused.is_empty() {
            return Err(format!("backpressure: {:?} never took direct input again", self.paused));
        }
        for (key, &n) in &self.emitted {
            let ledger = self.ledger.get(key).cloned().unwrap_or_default();
            if ledger.processed != n {
                return Err(format!(
                    "exactly once: {} of {n} records of {} processed",
                    ledger.processed,
                    show(key)
                ));
            }
            let live = ledger.processed - ledger.cleared_at;
            let shared = self.shared.get(key).copied();
            match self.holder.get(key) {
                None if live == 0 && shared.is_some() => {
                    return Err(format!(
                        "deletes: the state of {} was deleted after its last record, but the shared store holds {shared:?}",
                        show(key)
                    ));
                }
                None if live == 0 => {}
                None if self.cfg.protocol == Protocol::Remote && shared == Some(live) => {}
                None if self.cfg.protocol == Protocol::Remote => {
                    return Err(format!(
                        "final count of {} in the shared store is {shared:?}, expected {live}",
                        show(key)
                    ));
                }
                None => return Err(format!("state of {} lost", show(key))),
                Some(at) => {
                    let count = self.tasks.get(at).and_then(|t| t.store.get(key)).copied();
                    if live == 0 {
                        return Err(format!(
                            "deletes: the state of {} was deleted after its last record, but {at} still holds {count:?}",
                            show(key)
                        ));
                    }
                    if count != Some(live) {
                        return Err(format!(
                            "final count of {} at {at} is {count:?}, expected {live}",
                            show(key)
                        ));
                    }
                }
            }
        }
        // One live copy without trusting `holder`: every stored key is where it says.
        for (id, t) in &self.tasks {
            if let Some((key, count)) = t.store.iter().find(|(k, _)| self.holder.get(*k) != Some(id)) {
                return Err(format!(
                    "one live copy: {id} still holds {} = {count} at the end, whose state is at {:?}",
                    show(key),
                    self.holder.get(key)
                ));
            }
        }
        if self.cfg.drain {
            for (id, t) in &self.tasks {
                if let super::world::Core::Koala(core) = &t.core
                    && self.claims.contains(&Some(*id))
                    && let Some(other) = core.klt().locations_named().first()
                {
                    return Err(format!("drain: {id} still names {other} as a location at the end"));
                }
            }
        }
        let retired = self.engine.retired(super::scenario::TARGET);
        if self.stats.progressive && !retired.is_empty() {
            return Err(format!("progressive migration did not release {retired:?}"));
        }
        self.check_consumers_end()
    }
}

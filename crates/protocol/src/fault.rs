//! Fault-injection switches: each turns on one deliberately broken rule of a protocol core, so
//! the simulator's negative tests (`tests/protocol_sim/broken.rs`) show its checks catch it. They
//! exist for tests only: without the `sim` feature (a release build) a switch is an empty type
//! that is always off, its `inject_fault_*` setter does not exist and the broken branches
//! compile away.

/// One fault-injection switch of a protocol core; off unless a test turned it on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FaultSwitch {
    #[cfg(any(test, feature = "sim"))]
    on: bool,
}

impl FaultSwitch {
    /// Whether the broken rule applies.
    #[inline(always)]
    pub(crate) fn on(self) -> bool {
        #[cfg(any(test, feature = "sim"))]
        return self.on;
        #[cfg(not(any(test, feature = "sim")))]
        return false;
    }

    /// Turns the broken rule on.
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn set(&mut self) {
        self.on = true;
    }
}

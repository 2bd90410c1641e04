//! The Nexmark queries (Q1–Q8, Q4*, Q6*) × {scale-out, scale-in, rebalance} of the operator the
//! paper reconfigures, under every protocol, judged by the oracle (docs/testing.md §1): the
//! output with the reconfiguration equals the output of the final deployment from the start.
//! Q4, Q6 and Q8 move keys with pending user timers. Q1 and Q2 (stateless) are also migrated (a
//! task to the other worker: a stateless operator has no buckets to rebalance), and the bid
//! aggregate (`bid-aggregate`, over the embedded generator) is scaled out, rebalanced and scaled
//! in in one run. Every run uses 2 worker processes over loopback TCP.

mod common;

mod koala {
    use super::common;
    crate::nexmark_matrix!("koala");
}

mod stop_and_restart {
    use super::common;
    crate::nexmark_matrix!("stop-and-restart");
}

mod remote {
    use super::common;
    crate::nexmark_matrix!("remote");
}

mod drrs {
    use super::common;
    crate::nexmark_matrix!("drrs");
}

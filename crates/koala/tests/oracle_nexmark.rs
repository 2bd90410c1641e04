//! The Nexmark queries (Q1–Q8, Q4*, Q6*) × {scale-out, scale-in, rebalance} of the operator the
//! paper reconfigures, under every protocol, judged by the oracle (docs/testing.md §1): the
//! output with the reconfiguration equals the output of the final deployment from the start.
//! Q4, Q6 and Q8 move keys with pending user timers. Every run uses 2 worker processes over
//! loopback TCP.

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

//! The real-world queries (Twitch, Taxi, Azure, Borg) × {scale-out, scale-in, rebalance} of the
//! operator the paper reconfigures, under every protocol, judged by the oracle (docs/testing.md
//! §1): the output with the reconfiguration equals the output of the final deployment from the
//! start. Every run uses 2 worker processes over loopback TCP. Koala runs every case in the
//! normal suite; the baselines their scale-outs and, per query, one run that rebalances and then
//! scales in; their separate scale-ins and rebalances are ignored for time (`--run-ignored
//! only`).

mod common;

mod koala {
    use super::common;
    crate::realworld_matrix!("koala", all);
}

mod stop_and_restart {
    use super::common;
    crate::realworld_matrix!("stop-and-restart", scale_out);
}

mod remote {
    use super::common;
    crate::realworld_matrix!("remote", scale_out);
}

mod drrs {
    use super::common;
    crate::realworld_matrix!("drrs", scale_out);
}

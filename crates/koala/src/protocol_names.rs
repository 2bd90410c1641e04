//! The protocols' names on the command line (`--protocol`, `--protocols`).

/// A protocol named on the command line (`--protocol`, `--protocols`).
pub fn parse_protocol(name: &str) -> anyhow::Result<koala_protocol::Protocol> {
    parse_protocol_flag(name, "--protocol")
}

/// [`parse_protocol`] for the flag `flag` (named in the error).
pub fn parse_protocol_flag(name: &str, flag: &str) -> anyhow::Result<koala_protocol::Protocol> {
    use koala_protocol::Protocol;
    Ok(match name {
        "koala" => Protocol::Koala,
        "stop-and-restart" => Protocol::StopAndRestart,
        "remote" => Protocol::Remote,
        "drrs" | "drrs-overlapping" => Protocol::Drrs,
        other => anyhow::bail!(
            "{flag} {other:?}: use koala, stop-and-restart, remote, drrs (the Koala authors' DRRS) or \
             drrs-overlapping (DRRS with the original DRRS's overlapping schedule)"
        ),
    })
}

/// The DRRS schedule a protocol name on the command line runs: `drrs-overlapping` the original
/// DRRS's, every other name the default (the Koala authors' port).
pub fn drrs_schedule_of(name: &str) -> koala_protocol::drrs::DrrsSchedule {
    use koala_protocol::drrs::DrrsSchedule;
    if name == "drrs-overlapping" { DrrsSchedule::Overlapping } else { DrrsSchedule::Ported }
}

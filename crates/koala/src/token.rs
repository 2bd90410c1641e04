//! Where a process finds the job token (docs/deploy.md): the environment variable
//! `KOALA_TOKEN` first, then a file (`--token-file`, `[coordinator] token_file`). The token is
//! never printed in full.

use std::path::Path;

use anyhow::Context;
use koala_types::handshake::Token;

/// The environment variable that carries the job token.
pub const ENV: &str = "KOALA_TOKEN";

/// The token from `KOALA_TOKEN`, else from `file` (`field` names where that came from), else
/// none.
pub fn find(file: Option<&Path>, field: &str) -> anyhow::Result<Option<Token>> {
    if let Some(text) = std::env::var_os(ENV) {
        let text = text.into_string().map_err(|_| anyhow::anyhow!("{ENV}: not UTF-8"))?;
        return Token::parse(&text, ENV).map(Some).map_err(anyhow::Error::msg);
    }
    let Some(file) = file else { return Ok(None) };
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("{field}: reading the job token from {}", file.display()))?;
    Token::parse(&text, &format!("{field} ({})", file.display())).map(Some).map_err(anyhow::Error::msg)
}

/// The job's token as `koala run` uses it: the user's (`KOALA_TOKEN`, `[coordinator]
/// token_file`), else a fresh random one that only this run's processes know.
pub fn for_local_run(file: Option<&Path>) -> anyhow::Result<Token> {
    match find(file, "coordinator.token_file")? {
        Some(token) => Ok(token),
        None => Token::generate().context("generating the job token"),
    }
}

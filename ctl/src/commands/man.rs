//! `sluicectl man --out DIR`: man pages from the same definitions as
//! `--help` (clap_mangen), one for `sluicectl` and one per subcommand
//! (`sluicectl-dataset-create.1`, as git and kubectl name theirs).

use std::path::Path;

use clap::CommandFactory;

use crate::cli::Cli;
use crate::error::{local, Result};

pub fn write(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(local(dir))?;
    let mut command = Cli::command();
    command.build();
    write_page(dir, &command, "sluicectl")
}

fn write_page(dir: &Path, command: &clap::Command, name: &str) -> Result<()> {
    let name: &'static str = Box::leak(name.to_string().into_boxed_str());
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone().name(name)).render(&mut page).map_err(local(&path))?;
    std::fs::write(&path, page).map_err(local(&path))?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        write_page(dir, sub, &format!("{name}-{}", sub.get_name()))?;
    }
    Ok(())
}

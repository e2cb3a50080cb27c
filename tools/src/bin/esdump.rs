use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = engine_state_tools::esdump::Args::parse();
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr());
    match engine_state_tools::esdump::run(&args, &mut out, &mut err) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Escaped as every stderr line is (docs/FORMAT.md): the message
            // may quote a URI or a directory name holding a newline.
            eprintln!(
                "esdump: {}",
                engine_state_reader::printable(&format!("{e:#}"))
            );
            std::process::ExitCode::FAILURE
        }
    }
}

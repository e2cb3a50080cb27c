use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = engine_state_tools::espublish::Args::parse();
    match engine_state_tools::espublish::run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("espublish: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

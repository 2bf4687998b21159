fn main() -> anyhow::Result<()> {
    controllers::cli::main()
}

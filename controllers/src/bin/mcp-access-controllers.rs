fn main() -> anyhow::Result<()> {
    controllers::wiring::main()
}

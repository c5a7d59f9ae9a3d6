"""Example user jobs: modules with `build(ssc, stream, args)` returning the output DStream."""

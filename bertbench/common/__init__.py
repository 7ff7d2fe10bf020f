"""What every layer uses: the exit-code policy, flags from dataclasses, durable writes, timing noise."""

"""What each inference engine needs: flags, capabilities, metric names, log patterns, launch.

Never imports ``app``: the application depends on adapters, not the other way round.
"""

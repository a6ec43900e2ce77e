"""Generated from proto/fastlane/v1 by scripts/gen_proto.py. Never edit; run `make proto`."""

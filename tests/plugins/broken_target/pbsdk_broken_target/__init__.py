"""A deliberately broken pbsdk target plugin: importing it fails, as a plugin with a missing dependency
would. Discovery must report it and still load every other target."""

raise ImportError("pbsdk_broken_target needs the 'not-a-real-sdk' package, which is not installed")

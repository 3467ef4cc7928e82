raise ImportError("pbsdk_broken_target needs a vendor SDK that is not installed")

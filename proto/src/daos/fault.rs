//! DAOS control-plane fault codes (`fault/code/codes.go`) that the pool
//! lifecycle can produce. A fault travels as an ErrorInfo with reason
//! `proto.fault.Fault` and metadata Domain, Code, Description, Reason, Resolution.

macro_rules! fault_codes {
    ($( $variant:ident = $value:literal, $domain:literal, $hint:literal; )*) => {
        /// A control-plane fault code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum FaultCode { $( $variant = $value, )* }

        impl FaultCode {
            /// Every code this crate knows.
            pub const ALL: &'static [FaultCode] = &[ $( FaultCode::$variant, )* ];

            /// The fault's domain as DAOS reports it.
            pub fn domain(self) -> &'static str {
                match self { $( FaultCode::$variant => $domain, )* }
            }

            /// What an operator should do about it.
            pub fn resolution(self) -> &'static str {
                match self { $( FaultCode::$variant => $hint, )* }
            }

            /// The code from its number.
            pub fn from_code(code: u32) -> Option<FaultCode> {
                match code { $( $value => Some(FaultCode::$variant), )* _ => None }
            }
        }
    };
}

fault_codes! {
    SystemPoolLocked = 402, "system", "retry the operation once the pool is unlocked";
    WrongSystem = 603, "server", "use the system name the servers were configured with";
    PoolScmTooSmall = 604, "server", "request a larger metadata (SCM) tier for the pool";
    PoolNvmeTooSmall = 605, "server", "request a larger data (NVMe) tier for the pool";
    PoolInvalidRanks = 606, "server", "name only ranks that are members of the system";
    PoolInvalidNumRanks = 607, "server", "ask for no more ranks than the system has";
    PoolInvalidServiceReps = 608, "server", "ask for fewer pool service replicas";
    PoolDuplicateLabel = 609, "server", "choose a label no other pool uses";
    HarnessNotStarted = 610, "server", "start the DAOS server and retry";
    DataPlaneNotStarted = 611, "server", "wait for the engines to start and retry";
    PoolNoLabel = 615, "server", "set the pool's label property";
    IncompatibleComponents = 616, "server", "use a client of the server's DAOS major.minor version";
    NoCompatibilityInsecure = 617, "server", "in insecure mode the client and server versions must match exactly";
    PoolHasContainers = 618, "server", "destroy the pool's containers first, or destroy recursively";
    PoolMemRatioNoRoles = 619, "server", "mem_ratio needs an MD-on-SSD configuration";
}

impl FaultCode {
    /// Whether DAOS's own clients retry a request that failed with this fault.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            FaultCode::SystemPoolLocked | FaultCode::DataPlaneNotStarted
        )
    }
}

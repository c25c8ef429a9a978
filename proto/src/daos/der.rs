//! DAOS error numbers (`daos_errno.h`). On the wire a DER code is negative.

use std::fmt;

macro_rules! der_codes {
    ($( $variant:ident = $value:literal, $name:literal, $text:literal; )*) => {
        /// A DAOS error number, stored as its positive value.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(i32)]
        pub enum Der { $( $variant = $value, )* }

        impl Der {
            /// Every code this crate knows.
            pub const ALL: &'static [Der] = &[ $( Der::$variant, )* ];

            /// The symbolic name, e.g. `DER_NONEXIST`.
            pub fn name(self) -> &'static str {
                match self { $( Der::$variant => $name, )* }
            }

            /// DAOS's one-line explanation of the code.
            pub fn description(self) -> &'static str {
                match self { $( Der::$variant => $text, )* }
            }

            /// The code from its positive or negative (wire) value.
            pub fn from_code(code: i32) -> Option<Der> {
                match code.checked_abs()? { $( $value => Some(Der::$variant), )* _ => None }
            }
        }
    };
}

der_codes! {
    NoPerm = 1001, "DER_NO_PERM", "Operation not permitted";
    NoHdl = 1002, "DER_NO_HDL", "Invalid handle";
    Inval = 1003, "DER_INVAL", "Invalid parameters";
    Exist = 1004, "DER_EXIST", "Entity already exists";
    Nonexist = 1005, "DER_NONEXIST", "The specified entity does not exist";
    Unreach = 1006, "DER_UNREACH", "Unreachable node";
    NoSpace = 1007, "DER_NOSPACE", "No space on storage target";
    Already = 1008, "DER_ALREADY", "Operation already performed";
    NoMem = 1009, "DER_NOMEM", "Out of memory";
    NoSys = 1010, "DER_NOSYS", "Function not implemented";
    TimedOut = 1011, "DER_TIMEDOUT", "Time out";
    Busy = 1012, "DER_BUSY", "Device or resource busy";
    Again = 1013, "DER_AGAIN", "Try again";
    Proto = 1014, "DER_PROTO", "Incompatible protocol";
    Uninit = 1015, "DER_UNINIT", "Not initialized";
    Trunc = 1016, "DER_TRUNC", "Buffer too short";
    Overflow = 1017, "DER_OVERFLOW", "Data too long for defined data type or buffer size";
    Canceled = 1018, "DER_CANCELED", "Operation canceled";
    Oog = 1019, "DER_OOG", "Out of group or member list";
    Misc = 1025, "DER_MISC", "Miscellaneous error";
    NotAttach = 1030, "DER_NOTATTACH", "Not attached";
    Mismatch = 1031, "DER_MISMATCH", "Version mismatch";
    Excluded = 1032, "DER_EXCLUDED", "Rank has been excluded";
    GrpVer = 1036, "DER_GRPVER", "Group versions do not match";
    HgFatal = 1045, "DER_HG_FATAL", "Fatal transport error";
    QuotaLimit = 1046, "DER_QUOTA_LIMIT", "Quota limit reached for the requested resource";
    Io = 2001, "DER_IO", "Generic I/O error";
    Enoent = 2003, "DER_ENOENT", "Entry not found";
    Stale = 2007, "DER_STALE", "Stale pool map version";
    NotLeader = 2008, "DER_NOTLEADER", "Not service leader";
    Shutdown = 2017, "DER_SHUTDOWN", "Service should shut down";
    InProgress = 2018, "DER_INPROGRESS", "Operation now in progress";
    NotReplica = 2020, "DER_NOTREPLICA", "Not a service replica";
    Csum = 2021, "DER_CSUM", "Checksum error";
    DfIncompt = 2023, "DER_DF_INCOMPT", "Incompatible data format";
    DataLoss = 2026, "DER_DATA_LOSS", "Data lost or not recoverable";
    AgentIncompat = 2029, "DER_AGENT_INCOMPAT", "Agent is incompatible with libdaos";
    Rf = 2031, "DER_RF", "Failures exceed the redundancy factor";
    AgentComm = 2034, "DER_AGENT_COMM", "Agent communication error";
    NotSupported = 2037, "DER_NOTSUPPORTED", "Operation not supported";
    ControlIncompat = 2038, "DER_CONTROL_INCOMPAT", "Control-plane component is incompatible";
    NoService = 2039, "DER_NO_SERVICE", "No service available";
    NoCert = 2043, "DER_NO_CERT", "Unable to access the certificate";
    BadCert = 2044, "DER_BAD_CERT", "Invalid certificate";
    ContNonexist = 2050, "DER_CONT_NONEXIST", "Container does not exist";
    ContDestroying = 2051, "DER_CONT_DESTROYING", "Container is being destroyed";
}

impl Der {
    /// The value as it travels in a response `status` field: negative.
    pub fn wire(self) -> i32 {
        -(self as i32)
    }

    /// Whether DAOS's own clients retry a pool request that failed with this code.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Der::TimedOut | Der::GrpVer | Der::Again | Der::Oog | Der::Unreach | Der::Excluded
        )
    }
}

/// DAOS's human format: `DER_NONEXIST(-1005): The specified entity does not exist`.
impl fmt::Display for Der {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}({}): {}",
            self.name(),
            self.wire(),
            self.description()
        )
    }
}

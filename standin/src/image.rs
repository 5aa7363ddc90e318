//! Module images as the drivers receive them: nvcc/NVRTC cubins (ELF, machine EM_CUDA), PTX
//! text, AMD HSA code objects (ELF, machine EM_AMDGPU). What the stand-in reads from them: the
//! target architecture, the kernel names, and per kernel what the real driver would use to check
//! a launch (registers, static shared memory, the parameter list when the image records it).
//!
//! The images carry machine code the stand-in never runs: a kernel name resolves to the SIMT
//! emulator's build of the same kernel (see `device.rs`).

use crate::error::{Error, Kind, Result};

/// ELF machine numbers.
const EM_CUDA: u16 = 190;
const EM_AMDGPU: u16 = 224;
/// Fatbin container magic (not loaded by the stand-in).
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// The largest image the stand-in accepts (a sanity bound for images given by pointer only).
const MAX_IMAGE: usize = 1 << 30;

/// What kind of image, and for which target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A cubin for `sm_<major><minor>`; `arch_specific` for the `a` targets (sm_90a), whose
    /// code runs on that exact compute capability only.
    Cubin { major: u32, minor: u32, arch_specific: bool },
    /// PTX for `.target` (`sm_90a`, `sm_90`).
    Ptx { target: String },
    /// An AMD code object for `gfx...`.
    Amd { gfx: String },
}

/// One parameter as an image declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageParam {
    pub size: u32,
    /// `Some(true)` when the image says it is a pointer (AMD metadata's `global_buffer`);
    /// `None` when the format does not say (cubins, PTX).
    pub pointer: Option<bool>,
}

/// One kernel of an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelMeta {
    pub name: String,
    pub regs: Option<u32>,
    pub static_smem: u32,
    /// A launch-bounds or metadata limit on threads per block.
    pub max_threads: Option<u32>,
    pub params: Option<Vec<ImageParam>>,
}

/// A parsed image.
#[derive(Clone, Debug)]
pub struct Image {
    pub target: Target,
    pub kernels: Vec<KernelMeta>,
}

impl Image {
    pub fn kernel(&self, name: &str) -> Option<&KernelMeta> {
        self.kernels.iter().find(|k| k.name == name)
    }
    pub fn names(&self) -> Vec<&str> {
        self.kernels.iter().map(|k| k.name.as_str()).collect()
    }
}

fn bad(msg: impl Into<String>) -> Error {
    Error::new(Kind::InvalidImage, msg)
}

/// The image at `ptr`, whose length the driver API does not pass: an ELF's extent is read from
/// its headers, PTX is NUL-terminated text.
///
/// # Safety
/// `ptr` must point to a complete image (as the real drivers require).
pub unsafe fn parse_at(ptr: *const u8) -> Result<Image> {
    if ptr.is_null() {
        return Err(Error::new(Kind::InvalidValue, "image pointer is null"));
    }
    // SAFETY: every image kind is at least 4 bytes (an ELF or fatbin magic, or PTX text plus its NUL).
    let head = unsafe { std::slice::from_raw_parts(ptr, 4) };
    if head == b"\x7fELF" {
        // SAFETY: an ELF header is 64 bytes.
        let hdr = unsafe { std::slice::from_raw_parts(ptr, 64) };
        let shoff = u64_at(hdr, 0x28)? as usize;
        let (shentsize, shnum) = (u16_at(hdr, 0x3a)? as usize, u16_at(hdr, 0x3c)? as usize);
        let phoff = u64_at(hdr, 0x20)? as usize;
        let (phentsize, phnum) = (u16_at(hdr, 0x36)? as usize, u16_at(hdr, 0x38)? as usize);
        let sh_end = shoff.checked_add(shentsize.checked_mul(shnum).ok_or_else(|| bad("ELF section table overflows"))?);
        let ph_end = phoff.checked_add(phentsize.checked_mul(phnum).ok_or_else(|| bad("ELF program table overflows"))?);
        let mut len = sh_end.zip(ph_end).map(|(a, b)| a.max(b).max(64)).ok_or_else(|| bad("ELF tables overflow"))?;
        if len > MAX_IMAGE || shentsize < 64 {
            return Err(bad("ELF header describes an implausible image"));
        }
        // SAFETY: the section table lies within the image (its header says so).
        let table = unsafe { std::slice::from_raw_parts(ptr, sh_end.unwrap_or(64).max(64)) };
        for i in 0..shnum {
            let sh = shoff + i * shentsize;
            let (typ, off, size) = (u32_at(table, sh + 4)?, u64_at(table, sh + 0x18)? as usize, u64_at(table, sh + 0x20)? as usize);
            if typ != 8 {
                // not NOBITS
                len = len.max(off.saturating_add(size));
            }
        }
        if len > MAX_IMAGE {
            return Err(bad("ELF sections describe an implausible image"));
        }
        // SAFETY: the extent computed from the image's own headers.
        return parse(unsafe { std::slice::from_raw_parts(ptr, len) });
    }
    if u32::from_le_bytes([head[0], head[1], head[2], head[3]]) == FATBIN_MAGIC {
        return Err(Error::new(
            Kind::NotSupported,
            "fatbin images are not loaded by the stand-in (it loads cubins, PTX and AMD code objects)",
        ));
    }
    // SAFETY: anything else must be NUL-terminated PTX text.
    let text = unsafe { std::ffi::CStr::from_ptr(ptr as *const std::ffi::c_char) };
    parse(text.to_bytes())
}

/// Parses an image of known length.
pub fn parse(bytes: &[u8]) -> Result<Image> {
    if bytes.starts_with(b"\x7fELF") {
        let elf = Elf::new(bytes)?;
        return match elf.machine {
            EM_CUDA => elf.cubin(),
            EM_AMDGPU => elf.amd(),
            m => Err(bad(format!("ELF machine {m} is neither EM_CUDA (190) nor EM_AMDGPU (224)"))),
        };
    }
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not an ELF image and not PTX text"))?;
    ptx(text)
}

fn u16_at(b: &[u8], o: usize) -> Result<u16> {
    b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or_else(|| bad("truncated image"))
}
fn u32_at(b: &[u8], o: usize) -> Result<u32> {
    b.get(o..o + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]])).ok_or_else(|| bad("truncated image"))
}
fn u64_at(b: &[u8], o: usize) -> Result<u64> {
    b.get(o..o + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8]))).ok_or_else(|| bad("truncated image"))
}

#[derive(Clone, Copy)]
struct Section {
    name: u32,
    typ: u32,
    addr: u64,
    off: usize,
    size: usize,
    link: u32,
}

struct Symbol<'a> {
    name: &'a str,
    info: u8,
    other: u8,
    value: u64,
}

struct Elf<'a> {
    b: &'a [u8],
    machine: u16,
    flags: u32,
    abi_version: u8,
    sections: Vec<Section>,
    shstr: Section,
}

impl<'a> Elf<'a> {
    fn new(b: &'a [u8]) -> Result<Self> {
        if b.len() < 64 || b[4] != 2 || b[5] != 1 {
            return Err(bad("not a 64-bit little-endian ELF image"));
        }
        let shoff = u64_at(b, 0x28)? as usize;
        let (shentsize, shnum, shstrndx) = (u16_at(b, 0x3a)? as usize, u16_at(b, 0x3c)? as usize, u16_at(b, 0x3e)? as usize);
        let mut sections = Vec::with_capacity(shnum);
        for i in 0..shnum {
            let o = shoff + i * shentsize;
            sections.push(Section {
                name: u32_at(b, o)?,
                typ: u32_at(b, o + 4)?,
                addr: u64_at(b, o + 0x10)?,
                off: u64_at(b, o + 0x18)? as usize,
                size: u64_at(b, o + 0x20)? as usize,
                link: u32_at(b, o + 0x28)?,
            });
        }
        let shstr = *sections.get(shstrndx).ok_or_else(|| bad("ELF image without a section name table"))?;
        Ok(Elf { b, machine: u16_at(b, 0x12)?, flags: u32_at(b, 0x30)?, abi_version: b[8], sections, shstr })
    }

    fn data(&self, s: &Section) -> Result<&'a [u8]> {
        if s.typ == 8 {
            return Ok(&[]);
        }
        self.b.get(s.off..s.off.saturating_add(s.size)).ok_or_else(|| bad("an ELF section lies outside the image"))
    }

    fn str_at(&self, table: &Section, off: u32) -> Result<&'a str> {
        let d = self.data(table)?;
        let tail = d.get(off as usize..).ok_or_else(|| bad("ELF string offset outside its table"))?;
        let end = tail.iter().position(|&c| c == 0).ok_or_else(|| bad("unterminated ELF string"))?;
        std::str::from_utf8(&tail[..end]).map_err(|_| bad("ELF string is not UTF-8"))
    }

    fn section_name(&self, s: &Section) -> Result<&'a str> {
        self.str_at(&self.shstr, s.name)
    }

    fn section(&self, name: &str) -> Option<Section> {
        self.sections.iter().copied().find(|s| self.section_name(s).ok() == Some(name))
    }

    /// The symbols of `.symtab` (else `.dynsym`).
    fn symbols(&self) -> Result<Vec<Symbol<'a>>> {
        let tab = self.sections.iter().find(|s| s.typ == 2).or_else(|| self.sections.iter().find(|s| s.typ == 11));
        let Some(tab) = tab else { return Ok(Vec::new()) };
        let strs = *self.sections.get(tab.link as usize).ok_or_else(|| bad("symbol table without strings"))?;
        let d = self.data(tab)?;
        d.chunks_exact(24)
            .map(|e| {
                Ok(Symbol {
                    name: self.str_at(&strs, u32_at(e, 0)?)?,
                    info: e[4],
                    other: e[5],
                    value: u64_at(e, 8)?,
                })
            })
            .collect()
    }

    /// A cubin: entry functions (`STO_CUDA_ENTRY`), registers from `.nv.info`'s
    /// EIATTR_REGCOUNT, static shared memory from `.nv.shared.<kernel>`, parameter sizes from
    /// `.nv.info.<kernel>`'s EIATTR_KPARAM_INFO.
    fn cubin(&self) -> Result<Image> {
        // From ELF ABI version 8 (CUDA 12.x) the SM number sits in bits 8..16 of e_flags.
        let sm = if self.abi_version >= 8 { (self.flags >> 8) & 0xff } else { self.flags & 0xff };
        let syms = self.symbols()?;
        let regs = self.section(".nv.info").map(|s| nv_info(self.data(&s).unwrap_or(&[]))).unwrap_or_default();
        let mut kernels = Vec::new();
        for (i, s) in syms.iter().enumerate() {
            if s.info & 0xf != 2 || s.other & 0x10 == 0 {
                continue; // not an entry function
            }
            let info = self.section(&format!(".nv.info.{}", s.name)).map(|sec| nv_info(self.data(&sec).unwrap_or(&[]))).unwrap_or_default();
            let mut params: Vec<(u16, ImageParam)> = info
                .iter()
                .filter(|(attr, _)| *attr == 0x17)
                .filter_map(|(_, p)| {
                    let ordinal = u16_at(p, 4).ok()?;
                    let size = (u32_at(p, 8).ok()? >> 18) & 0x3fff;
                    Some((ordinal, ImageParam { size, pointer: None }))
                })
                .collect();
            params.sort_by_key(|(o, _)| *o);
            let reg = regs.iter().filter(|(a, _)| *a == 0x2f).find_map(|(_, p)| {
                (u32_at(p, 0).ok()? as usize == i).then(|| u32_at(p, 4).ok()).flatten()
            });
            let max_threads = info.iter().find(|(a, _)| *a == 0x05).and_then(|(_, p)| u32_at(p, 0).ok());
            kernels.push(KernelMeta {
                name: s.name.to_string(),
                regs: reg,
                static_smem: self.section(&format!(".nv.shared.{}", s.name)).map(|x| x.size as u32).unwrap_or(0),
                max_threads,
                params: Some(params.into_iter().map(|(_, p)| p).collect()),
            });
        }
        // `.nv.compat` attribute 9 is 1 in cubins for the arch-specific `a` targets (0 for the
        // plain and `f` ones): measured on nvcc 13.5 output for sm_100a / sm_100f / sm_100.
        let arch_specific = self
            .section(".nv.compat")
            .map(|c| nv_info(self.data(&c).unwrap_or(&[])).iter().any(|(a, v)| *a == 9 && v.first().is_some_and(|&x| x != 0)))
            .unwrap_or(false);
        Ok(Image { target: Target::Cubin { major: sm / 10, minor: sm % 10, arch_specific }, kernels })
    }

    /// An AMD code object: kernels are the symbols `k` with a descriptor `k.kd`; their limits
    /// and parameters come from the AMDGPU metadata note, else from the kernel descriptor.
    fn amd(&self) -> Result<Image> {
        let gfx = match self.flags & 0xff {
            0x4c => "gfx942".to_string(),
            0x4f => "gfx950".to_string(),
            m => format!("gfx(EF_AMDGPU_MACH {m:#x})"),
        };
        let syms = self.symbols()?;
        let meta = self.sections.iter().filter(|s| s.typ == 7).find_map(|s| amd_metadata(self.data(s).ok()?));
        let mut kernels = Vec::new();
        for s in &syms {
            let Some(kd) = syms.iter().find(|k| k.name.strip_suffix(".kd") == Some(s.name)) else { continue };
            let m = meta.as_ref().and_then(|m| m.iter().find(|k| k.name == s.name));
            let descriptor = self.bytes_at(kd.value, 64);
            let lds = descriptor.and_then(|d| u32_at(d, 0).ok()).unwrap_or(0);
            // compute_pgm_rsrc1 bits 0..6: granulated VGPR count, granule 8 on gfx90a/gfx94x/gfx950.
            let vgpr = descriptor.and_then(|d| u32_at(d, 48).ok()).map(|r| ((r & 0x3f) + 1) * 8);
            kernels.push(KernelMeta {
                name: s.name.to_string(),
                regs: m.and_then(|m| m.vgprs).or(vgpr),
                static_smem: m.and_then(|m| m.lds).unwrap_or(lds),
                max_threads: m.and_then(|m| m.max_flat_workgroup),
                params: m.map(|m| m.params.clone()),
            });
        }
        Ok(Image { target: Target::Amd { gfx }, kernels })
    }

    /// `len` bytes at virtual address `addr` (through the section holding it).
    fn bytes_at(&self, addr: u64, len: usize) -> Option<&'a [u8]> {
        let s = self.sections.iter().find(|s| s.typ != 8 && s.addr <= addr && addr + len as u64 <= s.addr + s.size as u64)?;
        let o = s.off + (addr - s.addr) as usize;
        self.b.get(o..o + len)
    }
}

/// `(attribute, payload)` entries of an `.nv.info*` section: each is `fmt u8, attr u8`, then a
/// u16 that is the payload size for EIFMT_SVAL (4) and an inline value otherwise.
fn nv_info(d: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    let mut o = 0;
    while o + 4 <= d.len() {
        let (fmt, attr) = (d[o], d[o + 1]);
        let v = u16::from_le_bytes([d[o + 2], d[o + 3]]) as usize;
        if fmt == 4 {
            let Some(p) = d.get(o + 4..o + 4 + v) else { break };
            out.push((attr, p));
            o += 4 + v;
        } else {
            out.push((attr, &d[o + 2..o + 4]));
            o += 4;
        }
    }
    out
}

/// PTX: `.target` and every `.entry` with its `.param` sizes.
fn ptx(text: &str) -> Result<Image> {
    let target = text
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(".target"))
        .map(|t| t.split(',').next().unwrap_or("").trim().to_string())
        .ok_or_else(|| bad("neither an ELF image nor PTX with a .target directive"))?;
    let mut kernels = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(".entry") {
        let after = &rest[i + ".entry".len()..];
        let name: String = after.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$').collect();
        let open = after.find('(');
        let close = after.find(')');
        let params = match (open, close) {
            (Some(a), Some(b)) if a < b && after[..a].trim() == name => after[a + 1..b].split(',').filter(|p| !p.trim().is_empty()).map(ptx_param).collect::<Option<Vec<_>>>(),
            _ => Some(Vec::new()),
        };
        if !name.is_empty() {
            kernels.push(KernelMeta { name, regs: None, static_smem: 0, max_threads: None, params });
        }
        rest = after;
    }
    Ok(Image { target: Target::Ptx { target }, kernels })
}

/// `.param .u64 k_param_0` -> 8; `.param .align 8 .b8 k_param_1[16]` -> 16.
fn ptx_param(p: &str) -> Option<ImageParam> {
    let words: Vec<&str> = p.split_whitespace().collect();
    let ty = words.iter().find(|w| w.starts_with('.') && *w != &".param" && *w != &".align" && *w != &".ptr")?;
    let elem: u32 = ty.trim_start_matches(|c: char| c == '.' || c.is_ascii_alphabetic()).parse::<u32>().ok()? / 8;
    let count = words.last().and_then(|n| n.split_once('[')).and_then(|(_, c)| c.trim_end_matches(']').parse::<u32>().ok()).unwrap_or(1);
    Some(ImageParam { size: elem * count, pointer: None })
}

/// What the AMDGPU metadata note says about one kernel.
#[derive(Clone, Debug, Default)]
struct AmdKernel {
    name: String,
    vgprs: Option<u32>,
    lds: Option<u32>,
    max_flat_workgroup: Option<u32>,
    params: Vec<ImageParam>,
}

/// The kernels of an NT_AMDGPU_METADATA note (type 32, owner "AMDGPU", msgpack payload).
fn amd_metadata(note: &[u8]) -> Option<Vec<AmdKernel>> {
    let mut o = 0;
    while o + 12 <= note.len() {
        let namesz = u32::from_le_bytes(note[o..o + 4].try_into().ok()?) as usize;
        let descsz = u32::from_le_bytes(note[o + 4..o + 8].try_into().ok()?) as usize;
        let typ = u32::from_le_bytes(note[o + 8..o + 12].try_into().ok()?);
        let name_at = o + 12;
        let desc_at = name_at + namesz.div_ceil(4) * 4;
        let desc = note.get(desc_at..desc_at + descsz)?;
        if typ == 32 && note.get(name_at..name_at + 6) == Some(b"AMDGPU") {
            let (v, _) = msgpack::value(desc)?;
            let kernels = v.get(".amdhsa.kernels").or_else(|| v.get("amdhsa.kernels"))?;
            let msgpack::Value::Array(ks) = kernels else { return None };
            return Some(
                ks.iter()
                    .map(|k| AmdKernel {
                        name: k.get(".name").and_then(|n| n.str()).unwrap_or("").to_string(),
                        vgprs: k.get(".vgpr_count").and_then(|n| n.uint()),
                        lds: k.get(".group_segment_fixed_size").and_then(|n| n.uint()),
                        max_flat_workgroup: k.get(".max_flat_workgroup_size").and_then(|n| n.uint()),
                        params: match k.get(".args") {
                            Some(msgpack::Value::Array(args)) => args
                                .iter()
                                .filter(|a| !a.get(".value_kind").and_then(|v| v.str()).unwrap_or("").starts_with("hidden_"))
                                .map(|a| ImageParam {
                                    size: a.get(".size").and_then(|s| s.uint()).unwrap_or(0),
                                    pointer: Some(a.get(".value_kind").and_then(|v| v.str()) == Some("global_buffer")),
                                })
                                .collect(),
                            _ => Vec::new(),
                        },
                    })
                    .collect(),
            );
        }
        o = desc_at + descsz.div_ceil(4) * 4;
    }
    None
}

/// The part of MessagePack the AMDGPU metadata uses (maps, arrays, strings, integers, bools).
mod msgpack {
    #[derive(Debug)]
    pub enum Value {
        Nil,
        Bool,
        Int(i64),
        Str(String),
        Array(Vec<Value>),
        Map(Vec<(Value, Value)>),
        Other,
    }

    impl Value {
        pub fn get(&self, key: &str) -> Option<&Value> {
            match self {
                Value::Map(m) => m.iter().find(|(k, _)| k.str() == Some(key)).map(|(_, v)| v),
                _ => None,
            }
        }
        pub fn str(&self) -> Option<&str> {
            match self {
                Value::Str(s) => Some(s),
                _ => None,
            }
        }
        pub fn uint(&self) -> Option<u32> {
            match self {
                Value::Int(i) => u32::try_from(*i).ok(),
                _ => None,
            }
        }
    }

    fn be(b: &[u8], n: usize) -> Option<u64> {
        Some(b.get(..n)?.iter().fold(0u64, |a, &x| (a << 8) | x as u64))
    }

    /// `n` values (or key/value pairs) and the bytes after them.
    fn seq(n: usize, mut r: &[u8], pairs: bool) -> Option<(Value, &[u8])> {
        let mut items = Vec::new();
        let mut map = Vec::new();
        for _ in 0..n {
            let (k, r2) = value(r)?;
            if pairs {
                let (v, r3) = value(r2)?;
                map.push((k, v));
                r = r3;
            } else {
                items.push(k);
                r = r2;
            }
        }
        Some((if pairs { Value::Map(map) } else { Value::Array(items) }, r))
    }

    fn str_of(n: usize, r: &[u8]) -> Option<(Value, &[u8])> {
        let s = r.get(..n)?;
        Some((Value::Str(String::from_utf8_lossy(s).into_owned()), &r[n..]))
    }

    /// One value and the bytes after it.
    pub fn value(b: &[u8]) -> Option<(Value, &[u8])> {
        let (&t, r) = b.split_first()?;
        match t {
            0x00..=0x7f => Some((Value::Int(t as i64), r)),
            0x80..=0x8f => seq((t & 0x0f) as usize, r, true),
            0x90..=0x9f => seq((t & 0x0f) as usize, r, false),
            0xa0..=0xbf => str_of((t & 0x1f) as usize, r),
            0xc0 => Some((Value::Nil, r)),
            0xc2 | 0xc3 => Some((Value::Bool, r)),
            0xcc..=0xcf => {
                let n = 1 << (t - 0xcc);
                Some((Value::Int(be(r, n)? as i64), r.get(n..)?))
            }
            0xd0..=0xd3 => {
                let n = 1 << (t - 0xd0);
                let raw = be(r, n)?;
                let shift = 64 - 8 * n as u32;
                Some((Value::Int(((raw << shift) as i64) >> shift), r.get(n..)?))
            }
            0xd9..=0xdb => {
                let n = 1 << (t - 0xd9);
                let len = be(r, n)? as usize;
                str_of(len, r.get(n..)?)
            }
            0xdc | 0xdd => {
                let n = if t == 0xdc { 2 } else { 4 };
                seq(be(r, n)? as usize, r.get(n..)?, false)
            }
            0xde | 0xdf => {
                let n = if t == 0xde { 2 } else { 4 };
                seq(be(r, n)? as usize, r.get(n..)?, true)
            }
            0xca => Some((Value::Other, r.get(4..)?)),
            0xcb => Some((Value::Other, r.get(8..)?)),
            0xe0..=0xff => Some((Value::Int((t as i8) as i64), r)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_entries_targets_and_params() {
        let text = "//\n.version 9.5\n.target sm_90a\n.address_size 64\n\n.visible .entry fill(\n\t.param .u64 fill_param_0,\n\t.param .u32 fill_param_1\n)\n{\n ret;\n}\n.visible .entry other(\n.param .align 8 .b8 other_param_0[16]\n)\n{ ret; }\n";
        let img = parse(text.as_bytes()).unwrap();
        assert_eq!(img.target, Target::Ptx { target: "sm_90a".into() });
        assert_eq!(img.names(), vec!["fill", "other"]);
        let sizes: Vec<u32> = img.kernel("fill").unwrap().params.as_ref().unwrap().iter().map(|p| p.size).collect();
        assert_eq!(sizes, vec![8, 4]);
        assert_eq!(img.kernel("other").unwrap().params.as_ref().unwrap()[0].size, 16);
        assert_eq!(parse(b"not an image").unwrap_err().kind, Kind::InvalidImage);
        assert_eq!(parse(b"\x7fELF\x02\x01\x01").unwrap_err().kind, Kind::InvalidImage);
    }

    #[test]
    fn msgpack_maps_arrays_and_ints() {
        // {"a": [1, -2, 300], "b": "xy"}
        let b = [0x82, 0xa1, b'a', 0x93, 0x01, 0xfe, 0xcd, 0x01, 0x2c, 0xa1, b'b', 0xa2, b'x', b'y'];
        let (v, rest) = msgpack::value(&b).unwrap();
        assert!(rest.is_empty());
        let msgpack::Value::Array(a) = v.get("a").unwrap() else { panic!() };
        assert_eq!(a.iter().map(|x| match x { msgpack::Value::Int(i) => *i, _ => 0 }).collect::<Vec<_>>(), vec![1, -2, 300]);
        assert_eq!(v.get("b").unwrap().str(), Some("xy"));
    }
}

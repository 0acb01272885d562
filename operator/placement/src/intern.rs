//! Reference-counted string interning for label keys and values, taints, models and network
//! positions: thousands of nodes repeat the same few strings, and comparing symbols is cheaper
//! than comparing text.

use std::collections::HashMap;
use std::sync::Arc;

/// An interned string.
pub(crate) type Sym = u32;

#[derive(Debug, Default)]
pub(crate) struct Interner {
    // Only looked up, never iterated, so its order cannot leak into decisions.
    ids: HashMap<Arc<str>, Sym>,
    strings: Vec<Option<(Arc<str>, u32)>>,
    free: Vec<Sym>,
}

impl Interner {
    /// The symbol of `s`, if some holder interned it.
    pub(crate) fn get(&self, s: &str) -> Option<Sym> {
        self.ids.get(s).copied()
    }

    /// Interns `s`, counting one more holder.
    pub(crate) fn intern(&mut self, s: &str) -> Sym {
        if let Some(&sym) = self.ids.get(s) {
            if let Some((_, refs)) = self.strings[sym as usize].as_mut() {
                *refs += 1;
            }
            return sym;
        }
        let text: Arc<str> = Arc::from(s);
        let sym = match self.free.pop() {
            Some(sym) => {
                self.strings[sym as usize] = Some((text.clone(), 1));
                sym
            }
            None => {
                self.strings.push(Some((text.clone(), 1)));
                (self.strings.len() - 1) as Sym
            }
        };
        self.ids.insert(text, sym);
        sym
    }

    /// Drops one holder of `sym`, forgetting the string when it was the last.
    pub(crate) fn release(&mut self, sym: Sym) {
        let slot = &mut self.strings[sym as usize];
        let last = match slot.as_mut() {
            Some((_, refs)) => {
                *refs -= 1;
                *refs == 0
            }
            None => false,
        };
        if last && let Some((text, _)) = slot.take() {
            self.ids.remove(&text);
            self.free.push(sym);
        }
    }

    /// The text of a live symbol.
    pub(crate) fn text(&self, sym: Sym) -> &Arc<str> {
        static EMPTY: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
        match self.strings.get(sym as usize) {
            Some(Some((text, _))) => text,
            _ => EMPTY.get_or_init(|| Arc::from("")),
        }
    }

    /// How many distinct strings are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_live_while_held() {
        let mut i = Interner::default();
        let a = i.intern("zone");
        assert_eq!(i.intern("zone"), a);
        assert_eq!(i.text(a).as_ref(), "zone");
        i.release(a);
        assert_eq!(i.get("zone"), Some(a));
        i.release(a);
        assert_eq!(i.get("zone"), None);
        assert_eq!(i.len(), 0);
        let b = i.intern("rack");
        assert_eq!(b, a, "the freed symbol is reused");
        assert_eq!(i.text(b).as_ref(), "rack");
    }
}

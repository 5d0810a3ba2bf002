import { describe, expect, it } from 'vitest';

import { actionSpec, actionWording, KERNEL_ACTIONS, offered } from '../src/actions';

describe('the kernel actions table', () => {
  it('lists interrupt, release cache, suspend, resume, restart and shut down with their route', () => {
    expect(KERNEL_ACTIONS.map(a => [a.action, a.verb, a.api])).toEqual([
      ['interrupt', 'Interrupt', 'interrupt'],
      ['release', 'Release cache', 'release'],
      ['suspend', 'Suspend', 'suspend'],
      ['resume', 'Resume', 'resume'],
      ['restart', 'Restart', 'restart'],
      ['shutdown', 'Shut down', 'shutdown']
    ]);
    expect(actionSpec('shutdown').warning).toContain('GPU memory is released');
    expect(actionSpec('release').warning).toBe("Frees this notebook's cached GPU memory; its variables stay.");
    expect(actionSpec('suspend').warning).toBe(
      "Moves this notebook's GPU memory into host memory; its variables stay, and it resumes on its next cell."
    );
    // release, suspend and resume keep every variable; only release is limited to holders on a card
    expect(KERNEL_ACTIONS.filter(a => !a.destructive).map(a => a.action)).toEqual(['release', 'suspend', 'resume']);
    expect(KERNEL_ACTIONS.filter(a => a.onlyForHolders).map(a => a.action)).toEqual(['release']);
  });

  it('offers Suspend only where it applies, Resume only while suspended, and no Release then', () => {
    const shown = (holder: boolean | null, suspendable: boolean, suspended: boolean) =>
      KERNEL_ACTIONS.filter(spec => offered(spec, { holder, suspendable, suspended })).map(a => a.action);
    expect(shown(null, false, false)).toEqual(['interrupt', 'release', 'restart', 'shutdown']);
    expect(shown(null, true, false)).toEqual(['interrupt', 'release', 'suspend', 'restart', 'shutdown']);
    expect(shown(false, true, false)).toEqual(['interrupt', 'suspend', 'restart', 'shutdown']);
    expect(shown(null, true, true)).toEqual(['interrupt', 'resume', 'restart', 'shutdown']);
    expect(actionWording('suspend', 'train.ipynb').label).toBe('Suspend the GPU of train.ipynb');
    expect(actionWording('resume', 'train.ipynb').failure).toBe('Could not resume the GPU of train.ipynb');
  });

  it('words "Release cache" as a sentence, not "Release cache the kernel of"', () => {
    expect(actionWording('release', 'train.ipynb')).toEqual({
      label: 'Release the cached GPU memory of train.ipynb',
      title: 'Release cached memory?',
      body: "Release the cached GPU memory of train.ipynb? Frees this notebook's cached GPU memory; its variables stay.",
      failure: 'Could not release the cached GPU memory of train.ipynb'
    });
  });

  it('words a button, its confirmation and its failure from the same row', () => {
    expect(actionWording('shutdown', 'train.ipynb')).toEqual({
      label: 'Shut down the kernel of train.ipynb',
      title: 'Shut down kernel?',
      body: 'Shut down the kernel of train.ipynb? All variables are lost and its GPU memory is released.',
      failure: 'Could not shut down the kernel of train.ipynb'
    });
    expect(actionWording('interrupt', 'sleep.ipynb').body).toBe(
      'Interrupt the kernel of sleep.ipynb? The running cell stops with KeyboardInterrupt.'
    );
  });
});
